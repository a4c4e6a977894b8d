// meshmuon._core.make_transport_communicator: a Communicator whose transport is a Python object
// (meshmuon/torch/_c10d.py: torch.distributed over a ProcessGroup). The engine calls the transport
// from the thread that drives it, usually with the GIL released (Optimizer.step and its
// constructor release it): every call into Python takes the GIL here. Buffers reach Python as 1-D
// torch tensors aliasing the engine's memory (DLPack, no copy): fp32, bf16, int32, int64, uint8;
// uint64 crosses as int64 (the same bits) with its real type named in the `dtype` argument.
// meshmuon._core.make_nccl_communicator: the nccl communicator (meshmuon/comm_nccl.h) bootstrapped through
// a Python exchange callable (bytes -> bytes of every rank's blob, rank order), so that meshmuon.torch
// can bootstrap it from torch.distributed (all_gather_object) without MPI.
// Also Communicator.counters() and Communicator.name (added to the class optimizer.cpp binds).
#include <nanobind/stl/shared_ptr.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "meshmuon/comm.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/comm_nccl.h"
#include "meshmuon/error.h"

namespace meshmuon::python {
namespace {

using Tensor = nb::ndarray<nb::pytorch, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::dlpack::dtype dl_dtype(CommType t) {
  switch (t) {
    case CommType::F32: return nb::dtype<float>();
    case CommType::BF16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case CommType::I32: return nb::dtype<int32_t>();
    case CommType::I64: case CommType::U64: return nb::dtype<int64_t>();
    case CommType::U8: return nb::dtype<uint8_t>();
  }
  return nb::dtype<uint8_t>();
}

// A torch tensor of `count` elements at `data` (aliasing, owned by the engine). GIL held.
nb::object tensor(const void* data, CommType t, size_t count) {
  alignas(8) static unsigned char dummy[8] = {};  // empty buffers may have no storage
  const size_t shape[1] = {count};
  void* p = data != nullptr && count > 0 ? const_cast<void*>(data) : dummy;
  Tensor a(p, 1, shape, nb::handle(), nullptr, dl_dtype(t), nb::device::cpu::value);
  return nb::cast(a, nb::rv_policy::reference);
}
nb::object tensor(const InBuffer& b) { return tensor(b.data, b.type, b.count); }
nb::object tensor(const OutBuffer& b) { return tensor(b.data, b.type, b.count); }

nb::list ints(std::span<const int64_t> v) {
  nb::list out;
  for (int64_t x : v) out.append(nb::int_(x));
  return out;
}
nb::list ints(std::span<const int> v) {
  nb::list out;
  for (int x : v) out.append(nb::int_(x));
  return out;
}

// The Python exception being handled as a C++ one ("TypeName: message"). GIL held.
[[noreturn]] void rethrow(const nb::python_error& e) {
  std::string msg = nb::type_name(e.type()).c_str();
  msg += ": ";
  msg += nb::str(e.value()).c_str();
  throw std::runtime_error(msg);
}

// Drops a Python reference from C++ (maybe without the GIL); leaks it once Python is gone.
void drop(nb::object& o) {
  if (!o.is_valid()) return;
  if (!Py_IsInitialized()) {
    (void)o.release();
    return;
  }
  nb::gil_scoped_acquire gil;
  o.reset();
}

class PyOp final : public TransportOp {
 public:
  explicit PyOp(nb::object test) : test_(std::move(test)) {}
  ~PyOp() override { drop(test_); }
  bool test() override {
    nb::gil_scoped_acquire gil;
    try {
      return nb::cast<bool>(test_());
    } catch (const nb::python_error& e) {
      rethrow(e);
    }
  }

 private:
  nb::object test_;  // the handle's bound test()
};

// None: complete already; else a handle with test(). GIL held.
std::unique_ptr<TransportOp> wrap(const nb::object& handle) {
  if (handle.is_none()) return nullptr;
  return std::make_unique<PyOp>(handle.attr("test"));
}

constexpr const char* kMethods[] = {"all_to_all_v", "all_gather_v", "reduce_scatter_v", "all_reduce",
                                    "broadcast",    "barrier",      "p2p",              "split"};

class PyTransport final : public Transport {
 public:
  PyTransport(nb::object obj, std::string backend) : obj_(std::move(obj)), backend_(std::move(backend)) {}
  ~PyTransport() override { drop(obj_); }

  std::string_view backend() const override { return backend_; }

  std::unique_ptr<TransportOp> all_to_all_v(InBuffer send, Counts send_counts, Counts send_displs, OutBuffer recv,
                                           Counts recv_counts, Counts recv_displs) override {
    nb::gil_scoped_acquire gil;
    return call("all_to_all_v", tensor(send), ints(send_counts), ints(send_displs), tensor(recv), ints(recv_counts),
                ints(recv_displs), name(send.type));
  }
  std::unique_ptr<TransportOp> all_gather_v(InBuffer send, OutBuffer recv, Counts recv_counts, Counts recv_displs) override {
    nb::gil_scoped_acquire gil;
    return call("all_gather_v", tensor(send), tensor(recv), ints(recv_counts), ints(recv_displs), name(send.type));
  }
  std::unique_ptr<TransportOp> reduce_scatter_v(InBuffer send, OutBuffer recv, Counts recv_counts, ReduceOp op) override {
    nb::gil_scoped_acquire gil;
    return call("reduce_scatter_v", tensor(send), tensor(recv), ints(recv_counts), std::string(to_string(op)),
                name(send.type));
  }
  std::unique_ptr<TransportOp> all_reduce(InBuffer send, OutBuffer recv, ReduceOp op) override {
    nb::gil_scoped_acquire gil;
    // in place: one tensor object for both arguments
    nb::object r = tensor(recv);
    nb::object s = send.data == recv.data ? r : tensor(send);
    return call("all_reduce", s, r, std::string(to_string(op)), name(send.type));
  }
  std::unique_ptr<TransportOp> broadcast(OutBuffer buf, int root) override {
    nb::gil_scoped_acquire gil;
    return call("broadcast", tensor(buf), root, name(buf.type));
  }
  std::unique_ptr<TransportOp> barrier() override {
    nb::gil_scoped_acquire gil;
    return call("barrier");
  }
  std::unique_ptr<TransportOp> p2p(std::span<const P2pOp> ops) override {
    nb::gil_scoped_acquire gil;
    nb::list batch;
    for (const P2pOp& o : ops) batch.append(nb::make_tuple(o.is_send, o.peer, tensor(o.buf)));
    return call("p2p", batch);
  }
  std::shared_ptr<Transport> split(std::span<const int> colors, std::span<const int> keys,
                                           const std::string& name) override {
    nb::gil_scoped_acquire gil;
    nb::object sub;
    try {
      sub = obj_.attr("split")(ints(colors), ints(keys), name);
    } catch (const nb::python_error& e) {
      rethrow(e);
    }
    if (sub.is_none()) return nullptr;
    return std::make_shared<PyTransport>(std::move(sub), backend_);
  }
  void on_timeout() override {
    nb::gil_scoped_acquire gil;
    try {
      if (nb::hasattr(obj_, "on_timeout")) obj_.attr("on_timeout")();
    } catch (const nb::python_error&) {
      // best effort: the timeout error itself is what the caller sees
    }
  }

 private:
  static std::string name(CommType t) { return std::string(to_string(t)); }

  template <class... Args>
  std::unique_ptr<TransportOp> call(const char* method, Args&&... args) {
    try {
      return wrap(obj_.attr(method)(std::forward<Args>(args)...));
    } catch (const nb::python_error& e) {
      rethrow(e);
    }
  }

  nb::object obj_;
  std::string backend_;
};

}  // namespace

void init_comm(nb::module_& m) {
  m.def(
      "make_transport_communicator",
      [](nb::object transport, int rank, int size, const std::string& name, int world_rank) {
        std::string missing;
        for (const char* method : kMethods)
          if (!nb::hasattr(transport, method)) missing += (missing.empty() ? "" : ", ") + std::string(method);
        if (!missing.empty())
          throw nb::type_error(("[python] make_transport_communicator: the transport (" +
                                std::string(nb::type_name(transport.type()).c_str()) + ") lacks " + missing +
                                "; see meshmuon/comm_transport.h and meshmuon/torch/_c10d.py")
                                   .c_str());
        std::string backend = nb::hasattr(transport, "backend") ? nb::cast<std::string>(transport.attr("backend")) : "external";
        auto t = std::make_shared<PyTransport>(std::move(transport), std::move(backend));
        return std::shared_ptr<Communicator>(make_communicator(std::move(t), rank, size, name, world_rank));
      },
      nb::arg("transport"), nb::arg("rank"), nb::arg("size"), nb::arg("name") = "world", nb::arg("world_rank") = -1,
      "A Communicator over a Python transport (methods all_to_all_v, all_gather_v, reduce_scatter_v, all_reduce, "
      "broadcast, barrier, p2p, split; attribute backend): meshmuon/comm_transport.h's contract. Local: posts nothing.");

  m.def(
      "make_nccl_communicator",
      [](nb::object exchange, int rank, int size, int device, const std::string& name) {
        if (!PyCallable_Check(exchange.ptr()))
          throw nb::type_error("[python] make_nccl_communicator: exchange must be a callable (bytes -> bytes)");
        // Called synchronously from this call, on this thread, with the GIL held.
        CommExchange ex = [exchange](std::span<const std::byte> mine) {
          nb::bytes blob(reinterpret_cast<const char*>(mine.data()), mine.size());
          nb::object out;
          try {
            out = exchange(blob);
          } catch (const nb::python_error& e) {
            rethrow(e);
          }
          if (!nb::isinstance<nb::bytes>(out))
            throw std::invalid_argument("[python] make_nccl_communicator: exchange must return bytes");
          const auto b = nb::borrow<nb::bytes>(out);
          const auto* p = reinterpret_cast<const std::byte*>(b.c_str());
          return std::vector<std::byte>(p, p + b.size());
        };
        return std::shared_ptr<Communicator>(make_nccl_communicator(rank, size, std::move(ex), device, name));
      },
      nb::arg("exchange"), nb::arg("rank"), nb::arg("size"), nb::arg("device") = -1, nb::arg("name") = "world",
      "The nccl communicator (meshmuon/comm_nccl.h): COLLECTIVE over `size` ranks. exchange(bytes) -> bytes "
      "all-gathers a blob among the ranks (every rank's, in rank order), e.g. through "
      "torch.distributed.all_gather_object. Raises meshmuon.Error naming the cause where it cannot run "
      "(no CUDA in the build, no device, libnccl missing).");
  m.def("nccl_available", &nccl_available,
        "True when this build has the nccl communicator compiled in (CUDA and the NCCL headers).");

  // Methods of the Communicator class bound in optimizer.cpp.
  nb::handle cls = nb::type<Communicator>();
  nb::setattr(cls, "counters",
              nb::cpp_function(
                  [](const Communicator& c) {
                    const CommCounters k = c.counters();
                    nb::dict d;
                    d["bytes_sent"] = k.bytes_sent;
                    d["bytes_recv"] = k.bytes_recv;
                    d["collectives"] = k.collectives;
                    return d;
                  },
                  nb::is_method(), nb::scope(cls), nb::name("counters"),
                  "Bytes sent / received and collectives posted on this communicator since it was made "
                  "(CommCounters; its splits count separately)."));
  nb::setattr(cls, "name",
              nb::steal(PyObject_CallFunctionObjArgs(
                  reinterpret_cast<PyObject*>(&PyProperty_Type),
                  nb::cpp_function([](const Communicator& c) { return c.name(); }, nb::is_method(), nb::scope(cls),
                                   nb::name("name"))
                      .ptr(),
                  nullptr)));
}

}  // namespace meshmuon::python
