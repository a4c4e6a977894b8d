// Shared by the ShardedParams dist tests (cpu and fake device): the model with uneven and empty
// shards and the FSDP / HSDP meshes each world size runs.
#pragma once

#include <string>
#include <vector>

#include "meshmuon/inventory.h"
#include "optimizer_fixture.h"

namespace meshmuon {
namespace {

ParamSpec spec(std::string name, Shape shape, Role role = Role::Muon, bool expert = false) {
  ParamSpec p;
  p.name = std::move(name), p.shape = shape, p.role = role, p.expert = expert;
  return p;
}

// Uneven and empty shards at S = 2..4 (rows 1, 3, 5, 7), a 1-D bias, an expert stack, a wider matrix.
std::vector<ParamSpec> model() {
  return {spec("w_r1", {1, 3}),          spec("w_r3", {3, 5}),   spec("w_r5", {5, 4}), spec("bias", {7}, Role::AdamW),
          spec("experts", {3, 4, 5}, Role::Muon, true), spec("w_r7", {7, 6}), spec("w_wide", {13, 64})};
}

// FSDP over all ranks, plus an HSDP mesh (or no mesh at one rank).
std::vector<std::string> meshes() {
  const int w = comm().size();
  std::vector<std::string> out = {"dp_shard=" + std::to_string(w)};
  if (w == 1) out.push_back("");
  if (w == 2) out.push_back("dp_replicate=2,dp_shard=1");
  if (w == 3) out.push_back("dp_replicate=3,dp_shard=1");
  if (w == 4) out.push_back("dp_replicate=2,dp_shard=2");
  return out;
}

}  // namespace
}  // namespace meshmuon
