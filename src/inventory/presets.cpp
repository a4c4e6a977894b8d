// Built-in model presets with their published shapes (config files / papers cited per model).
// Names follow torchtitan (llama3, qwen3, deepseek-v3), nanochat and HF GPT-2.
#include <functional>
#include <map>

#include "meshmuon/error.h"
#include "meshmuon/inventory.h"

namespace meshmuon {
namespace {

struct Builder {
  ModelDesc m;
  void add(std::string name, std::initializer_list<int64_t> shape, Role role, TpStyle tp = TpStyle::None,
           bool expert = false, std::optional<QkTag> qk = std::nullopt) {
    ParamSpec p;
    p.name = std::move(name);
    p.shape = Shape(shape);
    p.role = role;
    p.tp = tp;
    p.expert = expert;
    p.qk = qk;
    m.params.push_back(std::move(p));
  }
  void muon(std::string name, int64_t out, int64_t in, TpStyle tp, std::optional<QkTag> qk = std::nullopt) {
    add(std::move(name), {out, in}, Role::Muon, tp, false, qk);
  }
  void experts(std::string name, int64_t e, int64_t out, int64_t in, TpStyle tp) {
    add(std::move(name), {e, out, in}, Role::Muon, tp, true);
  }
  void adamw(std::string name, std::initializer_list<int64_t> shape, TpStyle tp = TpStyle::None) {
    add(std::move(name), shape, Role::AdamW, tp);
  }
};

std::string at(int layer, const char* rest) { return "layers." + std::to_string(layer) + "." + rest; }
QkTag tag(int layer, QkKind kind, int heads, int head_dim, int rope = 0, int v = 0) {
  return QkTag{layer, kind, heads, head_dim, rope, v};
}

// GPT-2 small (HF `gpt2`, tied LM head; Conv1D weights stored here as Linear [out, in]).
ModelDesc gpt2_124m() {
  Builder b{{"gpt2-124m", {}}};
  const int64_t d = 768, v = 50257;
  b.adamw("wte.weight", {v, d}, TpStyle::Colwise);
  b.adamw("wpe.weight", {1024, d});
  for (int i = 0; i < 12; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    b.adamw(h + "ln_1.weight", {d});
    b.adamw(h + "ln_1.bias", {d});
    b.muon(h + "attn.c_attn.weight", 3 * d, d, TpStyle::Colwise);  // fused q,k,v: no QK tag
    b.adamw(h + "attn.c_attn.bias", {3 * d}, TpStyle::Colwise);
    b.muon(h + "attn.c_proj.weight", d, d, TpStyle::Rowwise);
    b.adamw(h + "attn.c_proj.bias", {d});
    b.adamw(h + "ln_2.weight", {d});
    b.adamw(h + "ln_2.bias", {d});
    b.muon(h + "mlp.c_fc.weight", 4 * d, d, TpStyle::Colwise);
    b.adamw(h + "mlp.c_fc.bias", {4 * d}, TpStyle::Colwise);
    b.muon(h + "mlp.c_proj.weight", d, 4 * d, TpStyle::Rowwise);
    b.adamw(h + "mlp.c_proj.bias", {d});
  }
  b.adamw("ln_f.weight", {d});
  b.adamw("ln_f.bias", {d});
  return b.m;
}

// nanochat depth 20: dim = 64·depth, head_dim 128, MLP 4×, vocab 65536, untied head, no biases and
// parameter-free RMSNorm (nanochat gpt.py).
ModelDesc nanochat_d20() {
  Builder b{{"nanochat-d20", {}}};
  const int64_t d = 1280, v = 65536;
  const int heads = 10;
  b.adamw("transformer.wte.weight", {v, d}, TpStyle::Colwise);
  for (int i = 0; i < 20; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    b.muon(h + "attn.c_q.weight", d, d, TpStyle::Colwise, tag(i, QkKind::Q, heads, 128));
    b.muon(h + "attn.c_k.weight", d, d, TpStyle::Colwise, tag(i, QkKind::K, heads, 128));
    b.muon(h + "attn.c_v.weight", d, d, TpStyle::Colwise);
    b.muon(h + "attn.c_proj.weight", d, d, TpStyle::Rowwise);
    b.muon(h + "mlp.c_fc.weight", 4 * d, d, TpStyle::Colwise);
    b.muon(h + "mlp.c_proj.weight", d, 4 * d, TpStyle::Rowwise);
  }
  b.adamw("lm_head.weight", {v, d}, TpStyle::Colwise);
  return b.m;
}

// Llama 3 (Meta config.json): GQA with 8 KV heads, head_dim 128, SwiGLU, vocab 128256, untied.
ModelDesc llama3(const char* name, int layers, int64_t d, int heads, int64_t ffn) {
  Builder b{{name, {}}};
  const int kv = 8, hd = 128;
  const int64_t v = 128256;
  b.adamw("tok_embeddings.weight", {v, d}, TpStyle::Colwise);
  for (int i = 0; i < layers; ++i) {
    b.adamw(at(i, "attention_norm.weight"), {d});
    b.muon(at(i, "attention.wq.weight"), heads * hd, d, TpStyle::Colwise, tag(i, QkKind::Q, heads, hd));
    b.muon(at(i, "attention.wk.weight"), kv * hd, d, TpStyle::Colwise, tag(i, QkKind::K, kv, hd));
    b.muon(at(i, "attention.wv.weight"), kv * hd, d, TpStyle::Colwise);
    b.muon(at(i, "attention.wo.weight"), d, heads * hd, TpStyle::Rowwise);
    b.adamw(at(i, "ffn_norm.weight"), {d});
    b.muon(at(i, "feed_forward.w1.weight"), ffn, d, TpStyle::Colwise);
    b.muon(at(i, "feed_forward.w2.weight"), d, ffn, TpStyle::Rowwise);
    b.muon(at(i, "feed_forward.w3.weight"), ffn, d, TpStyle::Colwise);
  }
  b.adamw("norm.weight", {d});
  b.adamw("output.weight", {v, d}, TpStyle::Colwise);
  return b.m;
}

// Qwen3-30B-A3B (HF config.json): 48 layers, dim 2048, 32 q / 4 kv heads of 128, QK-norm, 128 experts
// of 768 (8 active), vocab 151936, untied.
ModelDesc qwen3_30b_a3b() {
  Builder b{{"qwen3-30b-a3b", {}}};
  const int64_t d = 2048, v = 151936, e = 128, f = 768;
  b.adamw("tok_embeddings.weight", {v, d}, TpStyle::Colwise);
  for (int i = 0; i < 48; ++i) {
    b.adamw(at(i, "attention_norm.weight"), {d});
    b.muon(at(i, "attention.wq.weight"), 32 * 128, d, TpStyle::Colwise, tag(i, QkKind::Q, 32, 128));
    b.muon(at(i, "attention.wk.weight"), 4 * 128, d, TpStyle::Colwise, tag(i, QkKind::K, 4, 128));
    b.muon(at(i, "attention.wv.weight"), 4 * 128, d, TpStyle::Colwise);
    b.muon(at(i, "attention.wo.weight"), d, 32 * 128, TpStyle::Rowwise);
    b.adamw(at(i, "attention.q_norm.weight"), {128});
    b.adamw(at(i, "attention.k_norm.weight"), {128});
    b.adamw(at(i, "ffn_norm.weight"), {d});
    b.adamw(at(i, "moe.router.gate.weight"), {e, d});
    b.experts(at(i, "moe.experts.w1"), e, f, d, TpStyle::Colwise);
    b.experts(at(i, "moe.experts.w2"), e, d, f, TpStyle::Rowwise);
    b.experts(at(i, "moe.experts.w3"), e, f, d, TpStyle::Colwise);
  }
  b.adamw("norm.weight", {d});
  b.adamw("output.weight", {v, d}, TpStyle::Colwise);
  return b.m;
}

// DeepSeek-V3 (HF config.json, arXiv 2412.19437): 61 layers, dim 7168, MLA (q_lora 1536, kv_lora 512,
// 128 heads, nope 128 + rope 64, v 128), first 3 layers dense (18432), then 256 routed experts of
// 2048 plus one shared expert; vocab 129280, untied. The multi-token-prediction module is not counted
// (671B main model).
ModelDesc deepseek_v3() {
  Builder b{{"deepseek-v3", {}}};
  const int64_t d = 7168, v = 129280, e = 256, f = 2048;
  const int h = 128, nope = 128, rope = 64, vd = 128;
  b.adamw("tok_embeddings.weight", {v, d}, TpStyle::Colwise);
  for (int i = 0; i < 61; ++i) {
    b.adamw(at(i, "attention_norm.weight"), {d});
    b.muon(at(i, "attention.wq_a.weight"), 1536, d, TpStyle::None);
    b.adamw(at(i, "attention.q_norm.weight"), {1536});
    b.muon(at(i, "attention.wq_b.weight"), h * (nope + rope), 1536, TpStyle::Colwise,
           tag(i, QkKind::Q, h, nope + rope, rope));
    b.muon(at(i, "attention.wkv_a.weight"), 512 + rope, d, TpStyle::None);
    b.adamw(at(i, "attention.kv_norm.weight"), {512});
    b.muon(at(i, "attention.wkv_b.weight"), h * (nope + vd), 512, TpStyle::Colwise,
           tag(i, QkKind::Kv, h, nope, 0, vd));
    b.muon(at(i, "attention.wo.weight"), d, h * vd, TpStyle::Rowwise);
    b.adamw(at(i, "ffn_norm.weight"), {d});
    if (i < 3) {
      b.muon(at(i, "feed_forward.w1.weight"), 18432, d, TpStyle::Colwise);
      b.muon(at(i, "feed_forward.w2.weight"), d, 18432, TpStyle::Rowwise);
      b.muon(at(i, "feed_forward.w3.weight"), 18432, d, TpStyle::Colwise);
      continue;
    }
    b.adamw(at(i, "moe.router.gate.weight"), {e, d});
    b.adamw(at(i, "moe.expert_bias"), {e});
    b.experts(at(i, "moe.experts.w1"), e, f, d, TpStyle::Colwise);
    b.experts(at(i, "moe.experts.w2"), e, d, f, TpStyle::Rowwise);
    b.experts(at(i, "moe.experts.w3"), e, f, d, TpStyle::Colwise);
    b.muon(at(i, "moe.shared_experts.w1.weight"), f, d, TpStyle::Colwise);
    b.muon(at(i, "moe.shared_experts.w2.weight"), d, f, TpStyle::Rowwise);
    b.muon(at(i, "moe.shared_experts.w3.weight"), f, d, TpStyle::Colwise);
  }
  b.adamw("norm.weight", {d});
  b.adamw("output.weight", {v, d}, TpStyle::Colwise);
  return b.m;
}

struct Preset {
  std::function<ModelDesc()> build;
  int64_t published;  // published total parameter count
};

const std::map<std::string, Preset, std::less<>>& presets() {
  static const std::map<std::string, Preset, std::less<>> table = {
      {"gpt2-124m", {gpt2_124m, 124'439'808}},  // HF gpt2 (124M)
      {"nanochat-d20", {nanochat_d20, 560'988'160}},  // nanochat d20 report
      {"llama3-8b", {[] { return llama3("llama3-8b", 32, 4096, 32, 14336); }, 8'030'000'000}},
      {"llama3-70b", {[] { return llama3("llama3-70b", 80, 8192, 64, 28672); }, 70'600'000'000}},
      {"qwen3-30b-a3b", {qwen3_30b_a3b, 30'500'000'000}},
      {"deepseek-v3", {deepseek_v3, 671'000'000'000}},
  };
  return table;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, p] : presets()) names.push_back(name);
  return names;
}

ModelDesc preset_model(std::string_view name) {
  const auto it = presets().find(name);
  if (it == presets().end()) {
    std::string list;
    for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
    detail::throw_invalid_argument(
        detail::concat("[inventory] unknown model '", name, "'; presets: ", list, " (or give --model-file)"));
  }
  return it->second.build();
}

int64_t preset_published_total(std::string_view name) {
  const auto it = presets().find(name);
  return it == presets().end() ? 0 : it->second.published;
}

}  // namespace meshmuon
