# dmuon: the human entry point.
#   make test   set up what is missing, build, run every test (README's test command; CI runs it)
#   make build  build everything; the CLI lands at build/bin/dmuon
#   make demo   run the main job (for now: the orthogonalization benchmark on a default shape)
BUILD ?= build
JOBS ?= $(shell nproc)
PYTHON ?= python3
CMAKE_FLAGS ?=
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")

# Open MPI as root (CI and these machines run as root) and more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1

.PHONY: all setup configure build test demo demo-adamw bench clean

all: build

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)
	@echo "built: $(BUILD)/bin/dmuon"

test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 600
	@$(PYTHON) -m pip install -q --no-build-isolation --disable-pip-version-check --root-user-action=ignore .
	@$(PYTHON) -m pytest tests/python tests/demo -q

demo: build
	@$(BUILD)/bin/dmuon bench ns --shape 1024x4096 --schedule polar_express --steps 5 --compare

# The training demo's AdamW baseline alone (examples/train_gpt; the dmuon run needs FSDP2 support).
demo-adamw: setup
	@$(or $(PYTHON),python3) examples/train_gpt/train.py --optimizers adamw

clean:
	rm -rf $(BUILD)
