// The one declaration of every JobConfig setting (job/job_config.h): its section, key, flag,
// commands, help line, the default --help shows, and its check. Everything that names a setting
// walks this declaration with a FieldVisitor:
//
//   visit_fields(config, visitor)
//       |-- the CLI (apps/): an option per field of its command, grouped by section in --help
//       |-- check_fields (below): each field's own check, naming the flag
//       |-- job/job_file.h: the TOML reader (unknown keys, wrong types and out-of-range values
//       |   name the file, line and key) and writer (--print-config, DIR/job.toml)
//       `-- reference_table: docs/TRAIN_CLI.md's table of settings (a test holds it to --help)
//
// A field's check sees the value alone; what depends on several fields is job/job_check.h's.
//
// Thread-safety: pure functions; a visitor is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "pipetrain/job/job_config.h"

namespace pipetrain::job {

// A field's check: "" when `value` is fine, else the whole message naming `flag` ("--batch-size
// must be at least 1, got 0"). The TOML reader puts the file, line and key before it.
template <typename T>
using Check = std::function<std::string(const std::string& flag, const T& value)>;

struct Field {
  std::string section;  // "training"
  std::string key;      // "batch_size": the TOML key, and the C++ member's name
  std::string flag;     // "--batch-size"; a word without dashes ("CHECKPOINT") is a positional
  std::string help;     // one line
  std::vector<Command> commands;  // the commands that take it
  std::string shown_default;      // what --help says of the default ("": the value itself)
  char delimiter = 0;             // a list on the command line: ',' (3,2,2) or 0 (several words)
  bool hidden = false;            // not in --help (a rank's own plumbing)
  bool number_as_text = false;    // a text a file may give as a number (chunks = 4, prefetch = 0)
  // A text that may come without a value: the flag alone (and `true` in a file) means this, and
  // `false` in a file means "none" (--offload-optimizer alone: cpu). "": a value is required.
  std::string implicit;

  bool serves(Command command) const;
  bool positional() const { return flag.rfind("--", 0) != 0; }
  std::string name() const { return section + "." + key; }  // "training.batch_size"
};

// Receives every field with a reference to its value in the visited JobConfig.
class FieldVisitor {
 public:
  virtual ~FieldVisitor() = default;
  virtual void field(const Field& f, bool& value) = 0;
  virtual void field(const Field& f, int64_t& value, const Check<int64_t>& check) = 0;
  virtual void field(const Field& f, std::optional<int64_t>& value,
                     const Check<int64_t>& check) = 0;
  virtual void field(const Field& f, uint64_t& value) = 0;
  virtual void field(const Field& f, double& value, const Check<double>& check) = 0;
  virtual void field(const Field& f, std::string& value, const Check<std::string>& check) = 0;
  virtual void field(const Field& f, std::vector<std::string>& value,
                     const Check<std::vector<std::string>>& check) = 0;
  virtual void field(const Field& f, std::vector<int64_t>& value,
                     const Check<std::vector<int64_t>>& check) = 0;
  virtual void field(const Field& f, std::vector<double>& value,
                     const Check<std::vector<double>>& check) = 0;
};

// A FieldVisitor whose every overload calls `Derived::on(field, value, check)`, a template over
// the value's type (a bool's and a seed's check is an empty Check): where a visitor does the same
// for every type but a few, it says so once, with `if constexpr` for the few.
template <typename Derived>
class TypedFieldVisitor : public FieldVisitor {
 public:
  void field(const Field& f, bool& value) override { self().on(f, value, Check<bool>()); }
  void field(const Field& f, int64_t& value, const Check<int64_t>& check) override {
    self().on(f, value, check);
  }
  void field(const Field& f, std::optional<int64_t>& value, const Check<int64_t>& check) override {
    self().on(f, value, check);
  }
  void field(const Field& f, uint64_t& value) override { self().on(f, value, Check<uint64_t>()); }
  void field(const Field& f, double& value, const Check<double>& check) override {
    self().on(f, value, check);
  }
  void field(const Field& f, std::string& value, const Check<std::string>& check) override {
    self().on(f, value, check);
  }
  void field(const Field& f, std::vector<std::string>& value,
             const Check<std::vector<std::string>>& check) override {
    self().on(f, value, check);
  }
  void field(const Field& f, std::vector<int64_t>& value,
             const Check<std::vector<int64_t>>& check) override {
    self().on(f, value, check);
  }
  void field(const Field& f, std::vector<double>& value,
             const Check<std::vector<double>>& check) override {
    self().on(f, value, check);
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

// True for std::optional<T> and std::vector<T> (what a visitor's `on` tells apart).
template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

// Every field of every command, in declaration order (sections in section_names()'s order).
void visit_fields(JobConfig& config, FieldVisitor& visitor);

// The fields' metadata alone.
std::vector<Field> fields();
std::vector<Field> fields_of(Command command);

// "model", "data", "training", "pipeline", ... in the order files and --help show them.
const std::vector<std::string>& section_names();
// One line heading a section in --help and the reference table ("Pipeline: stages, ...").
std::string section_title(const std::string& section);

// Each field's own check, for the fields `command` takes. Throws BadInput with the first failing
// field's message.
void check_fields(const JobConfig& config, Command command);

// A field's value as the command line and the reference table write it: "128", "3,2,2", "" for
// an empty text, "(not given)" for an unset optional.
std::string value_text(const JobConfig& config, const Field& field);

// The Markdown table of `command`'s settings: one row per field, by section -- flag, TOML key,
// default, help. docs/TRAIN_CLI.md holds the train table; a test compares it with --help.
std::string reference_table(Command command);

}  // namespace pipetrain::job
