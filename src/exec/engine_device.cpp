// Internal: the engine's backend selection and its test hook (engine_device.h).
#include "exec/engine_device.h"

#include <optional>
#include <string>

#include "dmuon/error.h"

namespace dmuon::detail {
namespace {

thread_local std::optional<EngineDevice> tl_injected;

}  // namespace

EngineDevice resolve_engine_device(std::string_view device) {
  if (tl_injected) return *tl_injected;
  const std::optional<Device> d = parse_device(device);
  DMUON_CHECK(d.has_value(), "[optim] option 'device' must be cpu, cuda or cuda:N (got '", device, "')");
  if (d->kind == DeviceKind::Cpu) return {make_cpu_backend(), host_memory_space()};
  std::shared_ptr<Backend> backend = make_cuda_backend(d->index);
  return {std::move(backend), default_memory_space()};
}

void check_comm_carries_device(const Backend& backend, const Communicator& comm, std::string_view who) {
  if (!backend.capabilities().device_memory || comm.device_buffers()) return;
  // The device kind without its index: the same text on every rank (agreements compare it).
  std::string kind = to_string(Device{backend.device().kind, 0});
  kind = kind.substr(0, kind.find(':'));
  throw_invalid_argument(concat(who, who.empty() ? "" : " ", "the engine runs on ", kind,
                                " (its buffers are device memory) but communicator '", comm.name(), "' (backend '",
                                comm.backend(), "') carries host memory only: pass make_single_communicator(\"", kind,
                                "\") for one rank, make_nccl_communicator(), or make_mpi_communicator() on a machine "
                                "where the GPU is visible (it stages through pinned memory); or run the engine on the "
                                "cpu"));
}

ScopedEngineDevice::ScopedEngineDevice(EngineDevice d) {
  DMUON_CHECK(d.backend && d.space, "[optim] internal: an injected engine device needs a backend and a memory space");
  if (tl_injected) previous_ = *tl_injected, had_previous_ = true;
  tl_injected = std::move(d);
}

ScopedEngineDevice::~ScopedEngineDevice() {
  if (had_previous_) tl_injected = std::move(previous_);
  else tl_injected.reset();
}

}  // namespace dmuon::detail
