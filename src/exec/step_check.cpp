// Internal: a step's local checks (step_inputs.h check_step_inputs).
#include <algorithm>
#include <string>

#include "meshmuon/error.h"
#include "meshmuon/qk_clip.h"
#include "exec/step_inputs.h"

namespace meshmuon::detail {
namespace {

void check_groups(const StepInputs& in, const ParamTable& table) {
  for (size_t g = 0; g < in.options.size(); ++g) {
    const GroupOptions& o = in.options[g];
    validate_group_options(o, g);
    MESHMUON_CHECK(o.algorithm == table.algorithm[g], "[optim] group ", g, ": algorithm changed after construction; build a new optimizer");
    if (o.algorithm != Algorithm::Muon) continue;
    MESHMUON_CHECK(o.num_heads == table.split[g].first && o.split_sizes == table.split[g].second, "[optim] group ", g,
                ": num_heads / split_sizes changed after construction (the plan's row blocks); build a new optimizer");
    MESHMUON_CHECK(!o.normuon || table.normuon[g], "[optim] group ", g,
                ": normuon was off at construction, so its state does not exist; enable it before constructing");
    MESHMUON_CHECK(o.normuon || !table.normuon[g], "[optim] group ", g, ": normuon may not be turned off after construction");
    // MuonEq / Muon+ turned on after construction: gram_allreduce cannot run them (optimizer.cpp)
    const char* scaling = o.ns.muon_eq ? "muon_eq" : o.ns.muon_plus ? "muon_plus" : nullptr;
    MESHMUON_CHECK(scaling == nullptr || table.gram_param[g] < 0, "[optim] group ", g, ": parameter '",
                table.gram_param[g] < 0 ? std::string() : table.names[static_cast<size_t>(table.gram_param[g])],
                "' uses gram_allreduce, which does not support ", scaling, "; pin another strategy or turn ", scaling, " off");
  }
}

void check_device(const TensorView& t, const char* what, const std::string& name, const StepDevice& d) {
  MESHMUON_CHECK(t.device == d.device, "[optim] ", what, "'", name, "' is on ", to_string(t.device), " but the optimizer runs on ",
              to_string(d.device), " (option 'device' = '", d.option, "'); pass views of ", to_string(d.device), " memory");
}

}  // namespace

std::vector<std::pair<int, const std::vector<float>*>> check_step_inputs(const StepInputs& in, const Inventory& inventory,
                                                                         const ParamTable& table,
                                                                         std::span<const ParamLayout> layouts,
                                                                         const StepDevice& device,
                                                                         std::vector<uint8_t>& has_grad) {
  const size_t n = inventory.params.size();
  MESHMUON_CHECK(in.params.size() == n && in.grads.size() == n, "[optim] step got ", in.params.size(), " parameters and ",
              in.grads.size(), " gradients; expected ", n, " of each (one local shard per inventory parameter)");
  check_groups(in, table);
  std::vector<std::pair<int, const std::vector<float>*>> logits;  // the layers QK-clip reads, once each
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& p = inventory.params[i];
    const Shape& local = table.local_shapes[i];
    const TensorView& w = in.params[i];
    const TensorView& gr = in.grads[i];
    has_grad[i] = gr.is_none() ? 0 : 1;
    MESHMUON_CHECK(w.shape == local, "[optim] parameter '", p.name, "': this rank's shard should have shape ", local.to_string(),
                " (its local box ", layouts[i].box.to_string(), "), got ", w.shape.to_string());
    MESHMUON_CHECK(w.dtype == DType::F32, "[optim] parameter '", p.name, "' is ", to_string(w.dtype), "; master parameters must be fp32");
    MESHMUON_CHECK(w.is_contiguous(), "[optim] parameter '", p.name, "' is not contiguous; pass a contiguous copy");
    MESHMUON_CHECK(local.numel() == 0 || w.data, "[optim] parameter '", p.name, "': null data pointer");
    check_device(w, "parameter ", p.name, device);
    if (gr.is_none()) continue;  // no gradient: the parameter sits this step out (agreed)
    MESHMUON_CHECK(gr.shape == local, "[optim] gradient of '", p.name, "': expected local shape ", local.to_string(), ", got ",
                gr.shape.to_string());
    MESHMUON_CHECK(gr.dtype == DType::F32 || gr.dtype == DType::BF16, "[optim] gradient of '", p.name, "' is ", to_string(gr.dtype),
                "; gradients must be fp32 or bf16");
    MESHMUON_CHECK(gr.is_contiguous(), "[optim] gradient of '", p.name, "' is not contiguous; pass a contiguous copy");
    MESHMUON_CHECK(local.numel() == 0 || gr.data, "[optim] gradient of '", p.name, "': null data pointer");
    check_device(gr, "gradient of ", p.name, device);
    const GroupOptions& o = in.options_of(table, i);
    if (o.algorithm != Algorithm::Muon || o.qk_clip_threshold <= 0 || !p.qk) continue;
    const auto it = in.qk_logits->find(p.qk->layer);
    MESHMUON_CHECK(it != in.qk_logits->end(), "[optim] parameter '", p.name, "' is QK-tagged (layer ", p.qk->layer, ") and group ",
                table.group_of[i], " has qk_clip_threshold > 0, but no logits were given for layer ", p.qk->layer);
    validate_qk_logits(*p.qk, it->second, p.name);
    if (std::none_of(logits.begin(), logits.end(), [&](const auto& l) { return l.first == it->first; }))
      logits.emplace_back(it->first, &it->second);
  }
  return logits;
}

}  // namespace meshmuon::detail
