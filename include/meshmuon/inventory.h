// Inventory: a model's parameters placed on the meshes of a parallel configuration, from a built-in
// preset or a JSON file (docs/model-format.md), with parallelism recipes that place parameters the
// way FSDP2 and torchtitan do. Pure and local; errors are std::invalid_argument naming the field.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/export.h"
#include "meshmuon/mesh.h"
#include "meshmuon/param_spec.h"

namespace meshmuon {

struct Inventory {
  std::string model;
  std::vector<std::string> mesh_names;  // parallel to `meshes` ("dense", "expert")
  std::vector<Mesh> meshes;             // every mesh spans the same world (row-major views of it)
  std::vector<ParamSpec> params;        // in the model's order; names are unique

  int world_size() const { return meshes.empty() ? 1 : meshes[0].size(); }
  MESHMUON_API int64_t num_elements() const;
  // Meshes non-empty and of one world size, unique names, every parameter valid on its mesh.
  MESHMUON_API void validate() const;
};

// `--parallel dp_replicate=R,dp_shard=S,tp=T,ep=E` (any subset, any order; missing = 1).
struct ParallelConfig {
  int dp_replicate = 1, dp_shard = 1, tp = 1, ep = 1;
  int world_size() const { return dp_replicate * dp_shard * tp; }
  // Experts: ep is carved out of dp_shard·tp (torchtitan with expert TP off): efsdp = dp_shard·tp / ep.
  int efsdp() const { return dp_shard * tp / ep; }
};
MESHMUON_API ParallelConfig parse_parallel(std::string_view text);  // throws std::invalid_argument
MESHMUON_API std::string to_string(const ParallelConfig& c);

// A model before placement: parameters with shapes, roles, tp hints and empty placements.
struct ModelDesc {
  std::string name;
  std::vector<ParamSpec> params;
};

// Built-in presets (published shapes): gpt2-124m, nanochat-d20, llama3-8b, llama3-70b,
// qwen3-30b-a3b, deepseek-v3. Throws std::invalid_argument listing the names for an unknown one.
MESHMUON_API std::vector<std::string> preset_names();
MESHMUON_API ModelDesc preset_model(std::string_view name);
// The published total parameter count of a preset (for checks and `meshmuon plan`); 0 if unknown.
MESHMUON_API int64_t preset_published_total(std::string_view name);

// Places a model on the meshes `config` implies, as FSDP2 / torchtitan do:
//   dense mesh (dp_replicate, dp_shard, tp), expert mesh (dp_replicate, efsdp, ep) when ep > 1;
//   dims of size 1 are left out (a one-rank world has no dims).
//   dp_replicate: Replicate. dp_shard / efsdp: Shard(0) (FSDP), or StridedShard(d, f) when a later
//   mesh dim (tp, ep) shards the same tensor dim d with f ranks. tp: colwise Shard(0), rowwise
//   Shard(1), none Replicate. Experts [E, out, in]: Shard(0) on ep, then efsdp on dim 0, or on dim 1
//   when efsdp·ep > E (torchtitan). With ep = 1 experts use the dense mesh.
// Throws std::invalid_argument when ep does not divide as torchtitan requires (tp | ep, ep/tp |
// dp_shard) or a parameter is invalid.
MESHMUON_API Inventory apply_parallel(const ModelDesc& model, const ParallelConfig& config);

// A model file (JSON, docs/model-format.md). Either every parameter gives placements and the file
// gives its meshes (then `config`, when given, must match the world size), or none does and
// `config` places them. Errors name the parameter (or index) and the field.
MESHMUON_API Inventory load_inventory_json(std::string_view json_text, const ParallelConfig* config,
                                        std::string_view source = "model file");
MESHMUON_API Inventory load_inventory_file(const std::string& path, const ParallelConfig* config);

}  // namespace meshmuon
