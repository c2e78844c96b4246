// What reads the field declaration (job/job_fields.h) without a file: the sections, each field's
// own check, a value as text, and the reference table of docs/TRAIN_CLI.md.
#include <sstream>

#include "pipetrain/base/error.h"
#include "pipetrain/job/job_fields.h"

namespace pipetrain::job {
namespace {

// Runs each check of a command's fields; the first message wins.
class RunChecks : public TypedFieldVisitor<RunChecks> {
 public:
  explicit RunChecks(Command command) : command_(command) {}
  std::string message;

  template <typename T, typename C>
  void on(const Field& f, T& value, const C& check) {
    if (!message.empty() || !check || !f.serves(command_)) return;
    if constexpr (IsOptional<T>::value) {
      if (value) message = check(f.flag, *value);
    } else {
      message = check(f.flag, value);
    }
  }

 private:
  Command command_;
};

// A field's value as the command line writes it.
class ValueText : public TypedFieldVisitor<ValueText> {
 public:
  explicit ValueText(std::string name) : name_(std::move(name)) {}
  std::string text;

  template <typename T, typename C>
  void on(const Field& f, T& value, const C&) {
    if (f.name() != name_) return;
    if constexpr (IsVector<T>::value) {
      const std::string between = f.delimiter ? std::string(1, f.delimiter) : " ";
      for (const auto& item : value) text += (text.empty() ? "" : between) + one(item);
    } else if constexpr (IsOptional<T>::value) {
      text = value ? one(*value) : "(not given)";
    } else {
      text = one(value);
    }
  }

 private:
  template <typename T>
  static std::string one(const T& value) {
    if constexpr (std::is_same_v<T, bool>) {
      return value ? "true" : "false";
    } else if constexpr (std::is_same_v<T, std::string>) {
      return value;
    } else {
      std::ostringstream out;
      out << value;
      return out.str();
    }
  }
  std::string name_;
};

std::string escape_cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += "\\";
    out += ch;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {
      "model",      "data",   "training",  "pipeline", "parallel", "optimizer", "zero", "memory",
      "checkpoint", "output", "inference", "eval",     "generate", "export",    "plan"};
  return names;
}

std::string section_title(const std::string& section) {
  static const std::vector<std::pair<std::string, std::string>> titles = {
      {"model", "Model"},
      {"data", "Data"},
      {"training", "Training: length, seed, logging"},
      {"pipeline", "Pipeline: stages, micro-batches, schedule"},
      {"parallel", "Processes: pipeline x tensor x data parallel"},
      {"optimizer", "Optimizer and learning rate"},
      {"zero", "ZeRO sharding"},
      {"memory", "Memory"},
      {"checkpoint", "Checkpoints"},
      {"output", "Output files"},
      {"inference", "Inference weights"},
      {"eval", "Evaluation"},
      {"generate", "Generation"},
      {"export", "Export"},
      {"plan", "Planning"}};
  for (const auto& [name, title] : titles) {
    if (name == section) return title;
  }
  return section;
}

void check_fields(const JobConfig& config, Command command) {
  JobConfig copy = config;
  RunChecks checks(command);
  visit_fields(copy, checks);
  if (!checks.message.empty()) throw BadInput(checks.message);
}

std::string value_text(const JobConfig& config, const Field& field) {
  JobConfig copy = config;
  ValueText text(field.name());
  visit_fields(copy, text);
  return text.text;
}

std::string reference_table(Command command) {
  const JobConfig defaults;
  std::string out = "| Flag | Key | Default | Meaning |\n|------|-----|---------|---------|\n";
  std::string section;
  for (const Field& f : fields_of(command)) {
    if (f.hidden) continue;
    if (f.section != section) {
      section = f.section;
      out += "| **" + section_title(section) + "** | `[" + section + "]` | | |\n";
    }
    std::string shown = f.shown_default.empty() ? value_text(defaults, f) : f.shown_default;
    out += "| `" + f.flag + "` | `" + f.key + "` | " +
           (shown.empty() ? "" : "`" + escape_cell(shown) + "`") + " | " + escape_cell(f.help) +
           " |\n";
  }
  return out;
}

}  // namespace pipetrain::job
