// DeepSpeed's ds_config.json into a JobConfig (pipetrain/job/deepspeed_config.h).
#include "pipetrain/job/deepspeed_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pipetrain/job/job_fields.h"
#include "pipetrain/job/training_setup.h"
#include "pipetrain/partition/memory.h"

namespace pipetrain::job {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Bytes of one parameter or gradient element: pipetrain keeps them in float32 under every
// precision, so DeepSpeed's element counts become bytes at 4 each.
constexpr int64_t kDeepSpeedElementBytes = 4;

std::string json_text(const json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

class DeepSpeedReader {
 public:
  DeepSpeedReader(const json& root, std::string source, JobConfig& config, Command command)
      : root_(root), source_(std::move(source)), config_(config), command_(command) {}

  DeepSpeedReading read() {
    batch();
    precision();
    optimizer();  // before the scheduler: WarmupCosineLR's ratios are of the optimizer's lr
    scheduler();
    scalar("gradient_clipping", [&](const json& v) {
      config_.optimizer.clip_grad_norm = number("gradient_clipping", v);
      set("gradient_clipping", "optimizer.clip_grad_norm");
    });
    if (!root_.contains("gradient_clipping") && command_ == Command::kTrain) {
      config_.optimizer.clip_grad_norm = 1.0;
      set("gradient_clipping", "optimizer.clip_grad_norm");
      out_.notes.push_back(
          "gradient_clipping: not in the file, DeepSpeed's default 1.0 (--clip-grad-norm 1)");
    }
    scalar("steps_per_print", [&](const json& v) {
      config_.training.log_every = positive("steps_per_print", v);
      set("steps_per_print", "training.log_every");
    });
    zero();
    pipeline();
    for (const auto& [key, value] : root_.items()) {
      if (!used_.count(key)) ignore(key, value);
    }
    return out_;
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    throw DeepSpeedConfigError(source_ + ": " + key + ": " + message);
  }

  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  double number(const std::string& key, const json& v) const {
    if (!v.is_number()) fail(key, "takes a number, got " + json_text(v));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0) fail(key, "takes a finite number >= 0, got " + json_text(v));
    return x;
  }
  int64_t integer(const std::string& key, const json& v) const {
    const double x = number(key, v);
    if (x != std::floor(x) || x > 9.0e18) fail(key, "takes a whole number, got " + json_text(v));
    return static_cast<int64_t>(x);
  }
  int64_t positive(const std::string& key, const json& v) const {
    const int64_t n = integer(key, v);
    if (n < 1) fail(key, "must be at least 1, got " + json_text(v));
    return n;
  }
  bool boolean(const std::string& key, const json& v) const {
    if (!v.is_boolean()) fail(key, "takes true or false, got " + json_text(v));
    return v.get<bool>();
  }
  std::string string(const std::string& key, const json& v) const {
    if (!v.is_string()) fail(key, "takes a string, got " + json_text(v));
    return v.get<std::string>();
  }
  const json& object(const std::string& key, const json& v) const {
    if (!v.is_object()) fail(key, "takes an object {...}, got " + json_text(v));
    return v;
  }

  // Calls `take` with the top-level key's value unless it is absent or "auto".
  template <typename F>
  void scalar(const std::string& key, F take) {
    used_.insert(key);
    const auto it = root_.find(key);
    if (it == root_.end() || is_auto(*it)) return;
    take(*it);
  }

  // A top-level {"type": ..., "params": {...}} section (optimizer, scheduler): its type and
  // params, its other keys ignored; nullopt where the file has none.
  std::optional<std::pair<std::string, json>> typed_section(const std::string& key) {
    used_.insert(key);
    const auto it = root_.find(key);
    if (it == root_.end()) return std::nullopt;
    const json& section = object(key, *it);
    if (!section.contains("type")) fail(key + ".type", "missing");
    std::string type = string(key + ".type", section["type"]);
    json params =
        section.contains("params") ? object(key + ".params", section["params"]) : json::object();
    for (const auto& [inner, v] : section.items()) {
      if (inner != "type" && inner != "params") ignore(key + "." + inner, v);
    }
    return std::make_pair(std::move(type), std::move(params));
  }

  void set(const std::string& key, const std::string& field) {
    out_.settings.emplace_back(key, field);
  }

  void ignore(const std::string& key, const json& value) {
    if (value.is_object() && !value.empty()) {
      for (const auto& [inner, v] : value.items()) ignore(key + "." + inner, v);
      return;
    }
    out_.ignored.push_back(key);
  }

  // The job's own accumulation steps (micro-batches per mini-batch; job_chunks), nullopt under
  // --chunks auto.
  std::optional<int64_t> own_chunks() const {
    if (config_.pipeline.chunks == "auto") return std::nullopt;
    return job_chunks(config_);
  }

  void batch() {
    const int64_t replicas = std::max<int64_t>(1, config_.parallel.dp);
    std::optional<int64_t> b, m, g;
    bool g_auto = false;
    const auto read = [&](const char* key, std::optional<int64_t>& into, bool* was_auto) {
      used_.insert(key);
      const auto it = root_.find(key);
      if (it == root_.end()) return;
      if (is_auto(*it)) {
        if (was_auto) *was_auto = true;
        return;
      }
      into = positive(key, *it);
    };
    bool b_auto = false;
    read("train_batch_size", b, &b_auto);
    read("train_micro_batch_size_per_gpu", m, nullptr);
    read("gradient_accumulation_steps", g, &g_auto);
    if (!b && !m && !g) return;  // every one absent or "auto": the job's own
    // "auto" (Hugging Face): from the job's settings.
    if (b_auto) b = config_.training.batch_size;
    if (g_auto) g = own_chunks();
    if (g_auto && !g) {  // --chunks auto: the planner's accumulation, the file's batch alone
      if (m)
        fail("train_micro_batch_size_per_gpu",
             "needs gradient_accumulation_steps: --chunks auto leaves it to the planner");
      config_.training.batch_size = *b;
      set("train_batch_size", "training.batch_size");
      return;
    }
    // DeepSpeed's completion (runtime/config.py, _set_batch_related_parameters).
    if (b && m && !g) {
      g = (*b / *m) / replicas;
    } else if (b && g && !m) {
      m = (*b / replicas) / *g;
    } else if (m && g && !b) {
      b = *m * *g * replicas;
    } else if (b && !m && !g) {
      g = 1;
      m = *b / replicas;
    } else if (m && !b && !g) {
      g = 1;
      b = *m * replicas;
    } else if (!b && !m) {  // only the accumulation steps
      b = config_.training.batch_size;
      m = (*b / replicas) / *g;
    }
    if (*m < 1 || *g < 1 || *b != *m * *g * replicas) {
      fail("train_batch_size", "train_batch_size " + std::to_string(*b) +
                                   " is not train_micro_batch_size_per_gpu " + std::to_string(*m) +
                                   " x gradient_accumulation_steps " + std::to_string(*g) + " x " +
                                   std::to_string(replicas) + " data-parallel replicas (--dp)");
    }
    config_.training.batch_size = *b;
    set("train_batch_size", "training.batch_size");
    if (!g_auto || config_.pipeline.chunks != "auto") {
      config_.pipeline.chunks = std::to_string(*g);
      set("gradient_accumulation_steps", "pipeline.chunks");
    }
  }

  void precision() {
    std::vector<std::pair<std::string, json>> fp16_keys;  // its loss-scaling keys
    const auto enabled = [&](const char* key) -> std::optional<bool> {
      used_.insert(key);
      const auto it = root_.find(key);
      if (it == root_.end()) return std::nullopt;
      const json& section = object(key, *it);
      std::optional<bool> on;
      for (const auto& [inner, v] : section.items()) {
        const std::string name = std::string(key) + "." + inner;
        if (inner == "enabled") {
          if (!is_auto(v)) on = boolean(name, v);
        } else if (std::string(key) == "fp16") {
          fp16_keys.emplace_back(inner, v);  // read below where fp16 runs
        } else {
          ignore(name, v);
        }
      }
      return on;
    };
    const std::optional<bool> bf16 =
        root_.contains("bfloat16") ? enabled("bfloat16") : enabled("bf16");
    used_.insert("bf16");
    used_.insert("bfloat16");
    const std::optional<bool> fp16 = enabled("fp16");
    if (bf16.value_or(false) && fp16.value_or(false)) {
      fail("fp16", "fp16 and bf16 are both enabled; enable one");
    }
    const bool fp16_auto = root_.contains("fp16") && root_["fp16"].contains("enabled") &&
                           is_auto(root_["fp16"]["enabled"]);
    if (fp16.value_or(false) || (fp16_auto && config_.pipeline.precision == "fp16")) {
      loss_scale(fp16_keys);
      if (fp16.value_or(false)) {
        config_.pipeline.precision = "fp16";
        set("fp16.enabled", "pipeline.precision");
      }
      return;
    }
    for (const auto& [inner, v] : fp16_keys) ignore("fp16." + inner, v);
    if (bf16.value_or(false)) {
      config_.pipeline.precision = "bf16";
    } else if (bf16.has_value() || fp16.has_value()) {
      config_.pipeline.precision = "fp32";
    } else {
      return;
    }
    set(bf16.value_or(false) ? "bf16.enabled" : "fp16.enabled", "pipeline.precision");
  }

  // fp16's loss scaling, DeepSpeed's rule (train/loss_scaler.h) with its defaults: loss_scale 0
  // (dynamic; above 0 a static scale), initial_scale_power 16, loss_scale_window 1000,
  // hysteresis 2, consecutive_hysteresis false, min_loss_scale 1.
  void loss_scale(const std::vector<std::pair<std::string, json>>& keys) {
    OptimizerSettings& o = config_.optimizer;
    o.loss_scaler = "deepspeed";
    set("fp16", "optimizer.loss_scaler");
    o.initial_loss_scale = 65536;
    o.loss_scale_window = 1000;
    o.loss_scale_hysteresis = 2;
    o.min_loss_scale = 1;
    o.loss_scale_consecutive_hysteresis = false;
    double fixed = 0;
    for (const auto& [inner, v] : keys) {
      const std::string key = "fp16." + inner;
      if (is_auto(v)) continue;
      if (inner == "loss_scale") {
        fixed = number(key, v);  // 0: dynamic; above: a static scale
      } else if (inner == "initial_scale_power") {
        const int64_t power = integer(key, v);
        if (power < 0 || power > 62) fail(key, "must be in 0..62, got " + json_text(v));
        o.initial_loss_scale = static_cast<double>(int64_t{1} << power);
        set(key, "optimizer.initial_loss_scale");
      } else if (inner == "loss_scale_window") {
        o.loss_scale_window = positive(key, v);
        set(key, "optimizer.loss_scale_window");
      } else if (inner == "hysteresis") {
        o.loss_scale_hysteresis = positive(key, v);
        set(key, "optimizer.loss_scale_hysteresis");
      } else if (inner == "consecutive_hysteresis") {
        o.loss_scale_consecutive_hysteresis = boolean(key, v);
        set(key, "optimizer.loss_scale_consecutive_hysteresis");
      } else if (inner == "min_loss_scale") {
        o.min_loss_scale = number(key, v);
        if (o.min_loss_scale <= 0) fail(key, "must be positive, got " + json_text(v));
        set(key, "optimizer.min_loss_scale");
      } else {
        ignore(key, v);
      }
    }
    if (fixed > 0) {
      o.loss_scaler = "static";
      o.initial_loss_scale = fixed;
      o.min_loss_scale = std::min(o.min_loss_scale, fixed);
      set("fp16.loss_scale", "optimizer.initial_loss_scale");
    }
  }

  void optimizer() {
    const auto section = typed_section("optimizer");
    if (!section) return;
    const auto& [type, params] = *section;
    std::string lower = type;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::string name;
    bool adam_w_mode = true;
    bool torch_adam = false;
    if (lower == "adam" || lower == "adamw") {
      if (params.contains("adam_w_mode")) {
        adam_w_mode = boolean("optimizer.params.adam_w_mode", params["adam_w_mode"]);
      }
      if (params.contains("torch_adam")) {
        torch_adam = boolean("optimizer.params.torch_adam", params["torch_adam"]);
      }
      name = lower == "adamw" || adam_w_mode ? "adamw" : "adam";
    } else if (type == "SGD") {  // torch.optim's, by its exact name
      name = "sgd";
    } else {
      fail("optimizer.type", "'" + type +
                                 "': pipetrain runs DeepSpeed's Adam and AdamW and "
                                 "torch's SGD");
    }
    config_.optimizer.name = name;
    set("optimizer.type", "optimizer.name");
    if (command_ == Command::kPlanModel) {
      config_.plan.optimizer = name == "sgd" && params.contains("momentum") &&
                                       !is_auto(params["momentum"]) &&
                                       number("optimizer.params.momentum", params["momentum"]) > 0
                                   ? "momentum"
                                   : name;
      set("optimizer.type", "plan.optimizer");
    }
    for (const auto& [inner, v] : params.items()) {
      const std::string key = "optimizer.params." + inner;
      if (inner == "adam_w_mode" || inner == "torch_adam") continue;
      if (is_auto(v)) continue;  // the job's own (lr, betas, eps, weight_decay)
      if (inner == "lr") {
        config_.optimizer.lr = number(key, v);
        set(key, "optimizer.lr");
      } else if (inner == "betas" && name != "sgd") {
        if (!v.is_array() || v.size() != 2) fail(key, "takes [beta1, beta2], got " + json_text(v));
        config_.optimizer.adam_betas = {number(key, v[0]), number(key, v[1])};
        set(key, "optimizer.adam_betas");
      } else if (inner == "eps" && name != "sgd") {
        config_.optimizer.adam_eps = number(key, v);
        set(key, "optimizer.adam_eps");
      } else if (inner == "weight_decay") {
        config_.optimizer.weight_decay = number(key, v);
        set(key, "optimizer.weight_decay");
      } else if (inner == "momentum" && name == "sgd") {
        config_.optimizer.momentum = number(key, v);
        set(key, "optimizer.momentum");
      } else if (inner == "bias_correction" && name != "sgd") {
        if (!boolean(key, v)) fail(key, "false cannot be honoured: pipetrain's Adam corrects");
      } else if (inner == "amsgrad" && name != "sgd") {
        if (boolean(key, v)) fail(key, "AMSGrad is not pipetrain's Adam");
      } else if (inner == "max_grad_norm") {
        fail(key, "DeepSpeed refuses it too: give gradient_clipping");
      } else {
        ignore(key, v);
      }
    }
    // torch.optim.AdamW's own default decay, where DeepSpeed hands the params to it.
    if (torch_adam && name == "adamw" && !params.contains("weight_decay")) {
      config_.optimizer.weight_decay = 0.01;
      set("optimizer.params.torch_adam", "optimizer.weight_decay");
      out_.notes.push_back(
          "optimizer.params.torch_adam: torch's AdamW, its default weight "
          "decay 0.01 (--weight-decay 0.01)");
    }
  }

  void scheduler() {
    const auto section = typed_section("scheduler");
    if (!section) return;
    const auto& [type, params] = *section;
    OptimizerSettings& o = config_.optimizer;
    std::set<std::string> keys;
    if (type == "WarmupLR" || type == "WarmupDecayLR") {
      o.lr_schedule = type == "WarmupLR" ? "warmup-lr" : "warmup-decay-lr";
      keys = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
      if (type == "WarmupDecayLR") keys.insert("total_num_steps");
    } else if (type == "WarmupCosineLR") {
      o.lr_schedule = "warmup-cosine-lr";
      keys = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
              "warmup_type"};
    } else if (type == "OneCycle" || type == "LRRangeTest") {
      fail("scheduler.type", "'" + type +
                                 "' is DeepSpeed's, not run by pipetrain: WarmupLR, "
                                 "WarmupDecayLR or WarmupCosineLR");
    } else {
      fail("scheduler.type", "unknown '" + type + "': WarmupLR, WarmupDecayLR or WarmupCosineLR");
    }
    set("scheduler.type", "optimizer.lr_schedule");
    const auto param = [&](const char* key) -> const json* {
      const auto found = params.find(key);
      return found == params.end() || is_auto(*found) ? nullptr : &*found;
    };
    const auto present = [&](const char* key) { return params.contains(key); };
    const std::string prefix = "scheduler.params.";
    // DeepSpeed's defaults where a key is absent; "auto" keeps the job's (Hugging Face's).
    if (const json* v = param("warmup_num_steps")) {
      o.warmup_steps = positive(prefix + "warmup_num_steps", *v);
    } else if (!present("warmup_num_steps")) {
      o.warmup_steps = 1000;
    }
    set(prefix + "warmup_num_steps", "optimizer.warmup_steps");
    o.warmup_type = "log";
    if (const json* v = param("warmup_type")) {
      o.warmup_type = string(prefix + "warmup_type", *v);
      if (o.warmup_type != "log" && o.warmup_type != "linear") {
        fail(prefix + "warmup_type", "log or linear, got '" + o.warmup_type + "'");
      }
    }
    set(prefix + "warmup_type", "optimizer.warmup_type");
    if (type == "WarmupCosineLR") {
      const double warmup_ratio = param("warmup_min_ratio") ? number(prefix + "warmup_min_ratio",
                                                                     *param("warmup_min_ratio"))
                                                            : 0.0;
      const double cos_ratio = param("cos_min_ratio")
                                   ? number(prefix + "cos_min_ratio", *param("cos_min_ratio"))
                                   : 0.0001;
      if (warmup_ratio > 1 || cos_ratio > 1) {
        fail(prefix + (warmup_ratio > 1 ? "warmup_min_ratio" : "cos_min_ratio"),
             "a ratio of the lr in 0..1");
      }
      o.warmup_min_lr = warmup_ratio * o.lr;
      o.min_lr = cos_ratio * o.lr;
      set(prefix + "warmup_min_ratio", "optimizer.warmup_min_lr");
      set(prefix + "cos_min_ratio", "optimizer.min_lr");
    } else {
      o.warmup_min_lr =
          param("warmup_min_lr") ? number(prefix + "warmup_min_lr", *param("warmup_min_lr")) : 0.0;
      set(prefix + "warmup_min_lr", "optimizer.warmup_min_lr");
      if (const json* v = param("warmup_max_lr")) {
        o.lr = number(prefix + "warmup_max_lr", *v);
        set(prefix + "warmup_max_lr", "optimizer.lr");
      } else if (!present("warmup_max_lr") && type == "WarmupDecayLR") {
        o.lr = 0.001;  // WarmupDecayLR's own default, not the optimizer's lr
        set(prefix + "warmup_max_lr", "optimizer.lr");
      }
    }
    if (keys.count("total_num_steps")) {
      if (const json* v = param("total_num_steps")) {
        o.lr_total_steps = positive(prefix + "total_num_steps", *v);
      } else if (!present("total_num_steps")) {
        fail(prefix + "total_num_steps", "required by " + type);
      } else {
        o.lr_total_steps = 0;  // auto: the run's steps
      }
      set(prefix + "total_num_steps", "optimizer.lr_total_steps");
    }
    for (const auto& [inner, v] : params.items()) {
      if (!keys.count(inner)) ignore(prefix + inner, v);
    }
  }

  // The model's hidden size for "auto" sizes (Hugging Face's rule), nullopt where it has none.
  std::optional<int64_t> hidden_size() const {
    const std::string& model_dir =
        command_ == Command::kPlanModel ? config_.plan.model : config_.model.name;
    const fs::path file = fs::path(model_dir) / "config.json";
    std::error_code error;
    if (model_dir.empty() || !fs::is_regular_file(file, error)) return std::nullopt;
    std::ifstream in(file);
    const json model = json::parse(in, nullptr, /*allow_exceptions=*/false);
    const auto from = [](const json& c) -> std::optional<int64_t> {
      if (!c.is_object()) return std::nullopt;
      if (c.contains("hidden_size") && c["hidden_size"].is_number_integer()) {
        return c["hidden_size"].get<int64_t>();
      }
      if (c.contains("hidden_sizes") && c["hidden_sizes"].is_array() &&
          !c["hidden_sizes"].empty()) {
        int64_t most = 0;
        for (const json& h : c["hidden_sizes"]) most = std::max(most, h.get<int64_t>());
        return most;
      }
      return std::nullopt;
    };
    if (auto h = from(model)) return h;
    if (model.is_object() && model.contains("text_config")) return from(model["text_config"]);
    return std::nullopt;
  }

  void zero() {
    used_.insert("zero_optimization");
    const auto it = root_.find("zero_optimization");
    if (it == root_.end()) return;
    const json& section = object("zero_optimization", *it);
    ZeroSettings& z = config_.zero;
    const std::string prefix = "zero_optimization.";
    int64_t stage = z.stage;
    if (section.contains("stage") && !is_auto(section["stage"])) {
      stage = integer(prefix + "stage", section["stage"]);
      if (stage > 3) fail(prefix + "stage", "0, 1, 2 or 3, got " + json_text(section["stage"]));
      z.stage = stage;
      set(prefix + "stage", "zero.stage");
    }
    std::optional<int64_t> h;
    bool h_read = false;
    // An element count, or "auto" from the model (nullopt: keep the job's).
    const auto elements = [&](const std::string& key, const json& v, double per_h2,
                              double per_h) -> std::optional<int64_t> {
      if (!is_auto(v)) return integer(key, v);
      if (!h_read) {
        h = hidden_size();
        h_read = true;
      }
      if (!h) {
        out_.notes.push_back(key + ": auto, and the model has no hidden size: pipetrain's own");
        return std::nullopt;
      }
      const double hd = static_cast<double>(*h);
      // Hugging Face's int(0.9 * h * h), left to right, and 10 * h.
      return static_cast<int64_t>(per_h2 * hd * hd + per_h * hd);
    };
    std::string nvme_path;
    const auto offload = [&](const std::string& name, bool params) {
      const json& o = object(prefix + name, section[name]);
      // DeepSpeed reads the path and the buffers of an nvme offload only.
      const bool nvme = o.contains("device") && o["device"] == "nvme";
      for (const auto& [inner, v] : o.items()) {
        const std::string key = prefix + name + "." + inner;
        if (!nvme && (inner == "nvme_path" || inner == "buffer_count" || inner == "buffer_size")) {
          ignore(key, v);
        } else if (inner == "device") {
          const std::string device = string(key, v);
          if (device != "none" && device != "cpu" && device != "nvme") {
            fail(key, "none, cpu or nvme, got '" + device + "'");
          }
          (params ? z.offload_params : z.offload_optimizer) = device;
          set(key, params ? "zero.offload_params" : "zero.offload_optimizer");
        } else if (inner == "nvme_path") {
          if (v.is_null()) continue;
          const std::string path = string(key, v);
          if (!nvme_path.empty() && path != nvme_path) {
            fail(key, "'" + path + "' is not the other nvme_path '" + nvme_path +
                          "': pipetrain keeps its offload files in one directory");
          }
          nvme_path = path;
          z.offload_dir = path;
          set(key, "zero.offload_dir");
        } else if (inner == "buffer_count") {
          const int64_t count = positive(key, v);
          // One pool serves both: the larger count.
          if (!buffer_count_ || count > *buffer_count_) buffer_count_ = count;
          z.offload_buffer_count = *buffer_count_;
          set(key, "zero.offload_buffer_count");
        } else if (inner == "buffer_size" && params) {
          z.offload_buffer_bytes = std::to_string(positive(key, v) * kDeepSpeedElementBytes);
          set(key, "zero.offload_buffer_bytes");
        } else if (inner == "ratio" && !params) {
          if (number(key, v) != 1.0) fail(key, "only 1 (the whole optimizer offloaded)");
        } else if (inner == "pin_memory") {
          boolean(key, v);  // pipetrain pins host memory where a CUDA device uses it
        } else {
          ignore(key, v);
        }
      }
    };
    for (const auto& [inner, v] : section.items()) {
      const std::string key = prefix + inner;
      std::string name = inner;
      if (name.rfind("stage3_", 0) == 0) name = name.substr(7);  // DeepSpeed takes both spellings
      if (inner == "stage") continue;
      if (inner == "offload_optimizer" || inner == "offload_param") {
        offload(inner, inner == "offload_param");
      } else if (inner == "overlap_comm") {
        if (config_.parallel.dp < 2) {
          ignore(key, v);  // one replica: no gradient sum to overlap
        } else if (!is_auto(v)) {
          config_.parallel.overlap_grad_reduce = boolean(key, v);
          set(key, "parallel.overlap_grad_reduce");
        }
      } else if (inner == "reduce_bucket_size") {
        if (auto n = elements(key, v, 1.0, 0.0)) {
          config_.parallel.bucket_size =
              static_cast<double>(*n * kDeepSpeedElementBytes) / static_cast<double>(1 << 20);
          set(key, "parallel.bucket_size");
        }
      } else if (name == "prefetch_bucket_size") {
        if (is_auto(v) && stage != 3) continue;  // Hugging Face fills it at stage 3 only
        if (auto n = elements(key, v, 0.9, 0.0)) {
          z.prefetch = std::to_string(*n * kDeepSpeedElementBytes);
          set(key, "zero.prefetch");
        }
      } else if (name == "param_persistence_threshold") {
        if (is_auto(v) && stage != 3) continue;
        if (auto n = elements(key, v, 0.0, 10.0)) {
          z.persistence_threshold = std::to_string(*n * kDeepSpeedElementBytes);
          set(key, "zero.persistence_threshold");
        }
      } else if (name == "max_live_parameters") {
        if (!is_auto(v)) {
          z.max_live = std::to_string(integer(key, v) * kDeepSpeedElementBytes);
          set(key, "zero.max_live");
        }
      } else if (name == "max_reuse_distance") {
        if (!is_auto(v)) {
          z.max_reuse_distance = std::to_string(integer(key, v) * kDeepSpeedElementBytes);
          set(key, "zero.max_reuse_distance");
        }
      } else if (inner == "sub_group_size") {
        if (!is_auto(v)) sub_group_ = integer(key, v);
      } else if (inner == "zero_quantized_weights") {
        if (!is_auto(v)) {
          z.quantized_weights = boolean(key, v);
          set(key, "zero.quantized_weights");
        }
      } else if (inner == "zero_quantized_gradients") {
        if (!is_auto(v)) {
          z.quantized_gradients = boolean(key, v);
          set(key, "zero.quantized_gradients");
        }
      } else if (inner == "zero_hpz_partition_size") {
        if (!is_auto(v)) {
          z.hpz_partition_size = positive(key, v);
          set(key, "zero.hpz_partition_size");
        }
      } else {
        ignore(key, v);
      }
    }
    if (sub_group_) {
      // A sub-group's state fields each fill one buffer: one larger than a buffer steps a
      // buffer's worth at a time (the same values: the step is elementwise).
      const int64_t per_buffer = buffer_elements();
      z.sub_group_size = per_buffer > 0 ? std::min(*sub_group_, per_buffer) : *sub_group_;
      if (z.sub_group_size != *sub_group_) {
        out_.notes.push_back(prefix + "sub_group_size " + std::to_string(*sub_group_) +
                             " is more than a buffer holds: stepped " +
                             std::to_string(z.sub_group_size) + " elements at a time");
      }
      set(prefix + "sub_group_size", "zero.sub_group_size");
    }
  }

  // Float32 elements one offload buffer holds (0 where its size does not parse: the job's check
  // names it).
  int64_t buffer_elements() const {
    try {
      return partition::parse_bytes(config_.zero.offload_buffer_bytes) / kDeepSpeedElementBytes;
    } catch (const std::exception&) {
      return 0;
    }
  }

  void pipeline() {
    used_.insert("pipeline");
    const auto it = root_.find("pipeline");
    if (it == root_.end()) return;
    const json& section = object("pipeline", *it);
    for (const auto& [inner, v] : section.items()) {
      const std::string key = "pipeline." + inner;
      if (inner == "activation_checkpoint_interval") {
        if (integer(key, v) > 0) {
          config_.pipeline.checkpoint = "always";
          set(key, "pipeline.checkpoint");
          out_.notes.push_back(key + " " + json_text(v) +
                               ": --checkpoint always (each stage's micro-batch recomputes its "
                               "forward whole before its backward)");
        }
      } else {
        ignore(key, v);  // DeepSpeed's engine does not read them either (its PipelineModule's)
      }
    }
  }

  const json& root_;
  std::string source_;
  JobConfig& config_;
  Command command_;
  DeepSpeedReading out_;
  std::set<std::string> used_;
  std::optional<int64_t> buffer_count_;
  std::optional<int64_t> sub_group_;
};

}  // namespace

DeepSpeedReading read_deepspeed_text(const std::string& text, const std::string& source,
                                     JobConfig& config, Command command,
                                     const std::vector<std::string>& given) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& error) {
    std::string message = error.what();
    const size_t at = message.find("parse error");
    throw DeepSpeedConfigError(
        source + ": not JSON: " + (at == std::string::npos ? message : message.substr(at)));
  }
  if (!root.is_object()) {
    throw DeepSpeedConfigError(source + ": a DeepSpeed config is a JSON object {...}");
  }
  const JobConfig before = config;
  DeepSpeedReading reading = DeepSpeedReader(root, source, config, command).read();
  // A setting both the flags and the file give must agree.
  const std::vector<Field> all = fields_of(command);
  for (const auto& [key, name] : reading.settings) {
    if (std::find(given.begin(), given.end(), name) == given.end()) continue;
    const auto field =
        std::find_if(all.begin(), all.end(), [&](const Field& f) { return f.name() == name; });
    if (field == all.end()) continue;
    const std::string was = value_text(before, *field);
    const std::string now = value_text(config, *field);
    if (was != now) {
      throw DeepSpeedConfigError(source + ": " + key + " makes " + field->flag + " " + now +
                                 ", and the command line gives " + field->flag + " " + was +
                                 ": give one, or the same");
    }
  }
  try {
    check_fields(config, command);
  } catch (const BadInput& error) {
    throw DeepSpeedConfigError(source + ": " + error.what());
  }
  return reading;
}

DeepSpeedReading read_deepspeed_config(const std::string& path, JobConfig& config, Command command,
                                       const std::vector<std::string>& given) {
  std::ifstream in(path);
  if (!in) throw DeepSpeedConfigError(path + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return read_deepspeed_text(text.str(), path, config, command, given);
}

}  // namespace pipetrain::job
