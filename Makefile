# meshmuon: the human entry point.
#   make test   set up what is missing, build, run every test (README's test command; CI runs it)
#   make build  build everything; the CLI lands at build/bin/meshmuon
#   make wheel  the manylinux_2_28 wheel: dist/meshmuon-<version>-<python>-manylinux_2_28_x86_64.whl
#               (VARIANT=cuda make wheel: with the CUDA backend, into dist/cu13/)
#   make demo   the main job: a 10.7M-parameter char GPT, FSDP2 on 4 CPU ranks (torchrun), meshmuon vs AdamW vs torch.optim.Muon
#   make bench  the orthogonalization benchmark on 1024x4096 (all methods, SGEMM baseline)
#   make train-cpp  the C++ trainer (examples/train_cpp): char MLP LM, FSDP on 2 CPU ranks, ~1 min
BUILD ?= build
JOBS ?= $(shell nproc)
PYTHON ?= python3
CMAKE_FLAGS ?=
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")

# ccache (CMake uses it where installed) keys on paths relative to the tree, so a fresh clone of the
# same sources (CI's) compiles nothing again.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

# Open MPI as root (CI and these machines run as root) and more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1

.PHONY: all setup configure build test wheel cleanroom demo bench train-cpp clean

all: build

setup:
	@echo "== $$(date +%T) setup"
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@echo "== $$(date +%T) build"
	@cmake --build $(BUILD) -j $(JOBS)
	@echo "built: $(BUILD)/bin/meshmuon"

# Each phase of `make test` prints the time it starts (`== HH:MM:SS phase`), so a log shows where the
# time goes (CI's whole run should stay well under 30 minutes).
test: build
	@echo "== $$(date +%T) ctest"
	@cd $(BUILD) && ctest --output-on-failure --timeout 600
	@echo "== $$(date +%T) cleanroom"
	@$(MAKE) --no-print-directory cleanroom
	@echo "== $$(date +%T) pip install ."
	@$(PYTHON) -m pip install -q --no-build-isolation --disable-pip-version-check --root-user-action=ignore .
	@echo "== $$(date +%T) pytest"
	@$(PYTHON) -m pytest tests/python tests/demo -q --durations=15
	@echo "== $$(date +%T) done"

# The wheel a user installs (scripts/build_wheel.sh: zig for glibc 2.28, auditwheel), then the
# clean-room test of it (tests/wheel/cleanroom.sh: a fresh venv, compilers and Debian libraries hidden).
wheel: setup
	@bash scripts/build_wheel.sh

cleanroom: wheel
	@bash tests/wheel/cleanroom.sh

# The training demo (examples/train_gpt): installs the package as `make test` does, then trains three times.
demo: build
	@$(PYTHON) -m pip install -q --no-build-isolation --disable-pip-version-check --root-user-action=ignore .
	@$(PYTHON) examples/train_gpt/train.py $(DEMO_ARGS)

bench: build
	@$(BUILD)/bin/meshmuon bench ns --shape 1024x4096 --schedule polar_express --steps 5 --compare

# The C++ trainer (examples/train_cpp): meshmuon::ShardedParams (FSDP) + meshmuon::Optimizer on 2 CPU ranks,
# 800 steps, checkpointing every 200 into $(BUILD)/train_cpp_ckpt (TRAIN_CPP_ARGS=--resume continues from it).
TRAIN_CPP_NP ?= 2
TRAIN_CPP_ARGS ?=
train-cpp: build
	@mpirun -np $(TRAIN_CPP_NP) --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS=1 \
	  -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
	  $(BUILD)/bin/train_cpp --ckpt-dir $(BUILD)/train_cpp_ckpt --ckpt-every 200 $(TRAIN_CPP_ARGS)

clean:
	rm -rf $(BUILD) build-wheel build-wheel-cu13 dist
