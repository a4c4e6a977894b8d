// Internal: the chunk arenas of the optimizer's steps (backend memory), kept free between chunks and
// from step to step: a chunk takes one with at least its arena's bytes and gives it back when it
// finishes.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/select.h"

namespace meshmuon::detail {

class ArenaPool {
 public:
  // A free arena of at least `bytes`, or a new one from `backend` (its step memory).
  Buffer take(Backend& backend, size_t bytes) {
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].bytes() >= bytes) {
        Buffer b = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    return backend.allocate(bytes, step_memory(backend));
  }
  void give(Buffer b) {
    if (b.data()) free_.push_back(std::move(b));
  }

 private:
  std::vector<Buffer> free_;
};

}  // namespace meshmuon::detail
