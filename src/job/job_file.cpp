// Jobs in TOML files (job/job_file.h): the reader walks the fields (job/job_fields.h) and takes
// each one's key from the file, with its type and check; keys no field claims are errors.
#include "pipetrain/job/job_file.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/job/job_fields.h"

namespace pipetrain::job {
namespace {

namespace fs = std::filesystem;

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

// Takes each field's key from the parsed file.
class Reader : public TypedFieldVisitor<Reader> {
 public:
  Reader(const toml::table& root, std::string source, Command command)
      : root_(root), source_(std::move(source)), command_(command) {}

  // Keys of the file that some field read ("section.key").
  std::set<std::string> claimed;

  template <typename T, typename C>
  void on(const Field& f, T& value, const C& check) {
    const toml::node* node = find(f);
    if (node == nullptr) return;
    if constexpr (IsOptional<T>::value) {
      value = convert<typename T::value_type>(f, *node);
      run(f, *node, *value, check);
    } else {
      value = convert<T>(f, *node);
      run(f, *node, value, check);
    }
  }

  [[noreturn]] void fail(const toml::node& node, const std::string& message) const {
    throw JobFileError(source_ + ":" + std::to_string(node.source().begin.line) + ": " + message);
  }

 private:
  const toml::node* find(const Field& f) {
    const toml::node* section = root_.get(f.section);
    if (section == nullptr || !section->is_table()) return nullptr;
    const toml::node* node = section->as_table()->get(f.key);
    if (node != nullptr) claimed.insert(f.name());
    return node;
  }

  [[noreturn]] void wrong(const Field& f, const toml::node& node, const std::string& want) const {
    fail(node, f.name() + " (" + f.flag + ") takes " + want + ", got " + type_name(node));
  }

  // The node as a T; an array, or one value standing for an array of one (path = "PREFIX"),
  // for a vector.
  template <typename T>
  T convert(const Field& f, const toml::node& node) const {
    if constexpr (std::is_same_v<T, bool>) {
      if (!node.is_boolean()) wrong(f, node, "true or false");
      return node.as_boolean()->get();
    } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
      if (!node.is_integer()) wrong(f, node, "an integer");
      const int64_t got = node.as_integer()->get();
      if (std::is_unsigned_v<T> && got < 0) {
        fail(node, f.name() + ": " + f.flag + " must be >= 0, got " + std::to_string(got));
      }
      return static_cast<T>(got);
    } else if constexpr (std::is_same_v<T, double>) {
      if (node.is_integer()) return static_cast<double>(node.as_integer()->get());
      if (!node.is_floating_point()) wrong(f, node, "a number");
      return node.as_floating_point()->get();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (node.is_string()) return node.as_string()->get();
      if (f.number_as_text && node.is_integer()) return std::to_string(node.as_integer()->get());
      if (!f.implicit.empty() && node.is_boolean()) {
        return node.as_boolean()->get() ? f.implicit : std::string("none");
      }
      wrong(f, node, f.number_as_text ? "a string or an integer" : "a string");
    } else {
      T out;
      if (node.is_table()) wrong(f, node, "an array");
      if (!node.is_array()) {
        out.push_back(convert<typename T::value_type>(f, node));
        return out;
      }
      for (const toml::node& item : *node.as_array()) {
        out.push_back(convert<typename T::value_type>(f, item));
      }
      return out;
    }
  }

  template <typename T, typename C>
  void run(const Field& f, const toml::node& node, const T& value, const C& check) const {
    if (!check || !f.serves(command_)) return;
    const std::string message = check(f.flag, value);
    if (!message.empty()) fail(node, f.name() + ": " + message);
  }

  const toml::table& root_;
  std::string source_;
  Command command_;
};

// ---- writing ------------------------------------------------------------------------------------

std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char ch : text) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", ch);
          out += escaped;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

// The shortest decimal form that reads back as the same double, as a TOML float.
std::string float_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  std::string out = text;
  if (out.find_first_of(".eEn") == std::string::npos) out += ".0";
  return out;
}

class Writer : public TypedFieldVisitor<Writer> {
 public:
  explicit Writer(Command command) : command_(command) {}
  // Per section, its lines.
  std::map<std::string, std::string> sections;

  template <typename T, typename C>
  void on(const Field& f, T& value, const C&) {
    if (!f.serves(command_) || f.hidden) return;
    std::string& out = sections[f.section];
    out += "# " + f.flag + ": " + f.help + "\n";
    if constexpr (IsOptional<T>::value) {
      if (!value) {
        out += "# " + f.key + " = ...  (not given: " + f.shown_default + ")\n";
        return;
      }
      out += f.key + " = " + one(*value) + "\n";
    } else if constexpr (IsVector<T>::value) {
      std::string items;
      for (const auto& item : value) items += (items.empty() ? "" : ", ") + one(item);
      out += f.key + " = [" + items + "]\n";
    } else {
      out += f.key + " = " + one(value) + "\n";
    }
  }

 private:
  template <typename T>
  static std::string one(const T& value) {
    if constexpr (std::is_same_v<T, bool>) {
      return value ? "true" : "false";
    } else if constexpr (std::is_same_v<T, double>) {
      return float_text(value);
    } else if constexpr (std::is_same_v<T, std::string>) {
      return toml_string(value);
    } else {
      return std::to_string(value);
    }
  }
  Command command_;
};

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw JobFileError("config file '" + path + "' cannot be opened");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw JobFileError("config file '" + path + "' cannot be read");
  return text.str();
}

}  // namespace

void read_job_text(const std::string& text, const std::string& source, JobConfig& config,
                   Command command) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& error) {
    throw JobFileError(source + ":" + std::to_string(error.source().begin.line) +
                       ": not TOML: " + std::string(error.description()));
  }
  Reader reader(root, source, command);
  visit_fields(config, reader);
  // What no field claimed: unknown sections and keys.
  std::map<std::string, std::vector<std::string>> keys_of;
  for (const Field& f : fields()) keys_of[f.section].push_back(f.key);
  for (const auto& [name, node] : root) {
    const std::string section(name.str());
    const auto known = keys_of.find(section);
    if (!node.is_table()) {
      reader.fail(node, "key '" + section + "' is outside a section; put it under its [section]");
    }
    if (known == keys_of.end()) {
      std::string valid;
      for (const std::string& s : section_names()) valid += (valid.empty() ? "" : ", ") + s;
      reader.fail(node, "unknown section [" + section + "]; valid: " + valid);
    }
    for (const auto& [key_name, value] : *node.as_table()) {
      const std::string key(key_name.str());
      if (reader.claimed.count(section + "." + key)) continue;
      std::string valid;
      for (const std::string& k : known->second) valid += (valid.empty() ? "" : ", ") + k;
      reader.fail(value, "unknown key '" + key + "' in [" + section + "]; valid: " + valid);
    }
  }
}

void read_job_file(const std::string& path, JobConfig& config, Command command) {
  read_job_text(read_whole(path), path, config, command);
}

std::string job_toml(const JobConfig& config, Command command) {
  JobConfig copy = config;
  Writer writer(command);
  visit_fields(copy, writer);
  std::string out = std::string("# pipetrain ") + command_name(command) +
                    ": the whole job, every default filled (pipetrain " + command_name(command) +
                    " --config FILE runs it; flags given beside --config replace its values)\n";
  for (const std::string& section : section_names()) {
    const auto lines = writer.sections.find(section);
    if (lines == writer.sections.end()) continue;
    out += "\n[" + section + "]\n" + lines->second;
  }
  return out;
}

std::optional<std::string> find_job_file(const std::string& checkpoint) {
  std::error_code error;
  const fs::path path(checkpoint);
  for (const fs::path& directory :
       {path, path.parent_path(), path.lexically_normal().parent_path()}) {
    if (directory.empty()) continue;
    const fs::path file = directory / "job.toml";
    if (fs::is_regular_file(file, error)) return file.string();
  }
  return std::nullopt;
}

void write_job_file(const std::string& directory, const JobConfig& config) {
  std::error_code error;
  fs::create_directories(directory, error);
  write_file_atomically((fs::path(directory) / "job.toml").string(),
                        job_toml(config, Command::kTrain));
}

JobConfig job_of_checkpoint(const std::string& checkpoint) {
  const std::optional<std::string> file = find_job_file(checkpoint);
  if (!file) {
    throw JobFileError("--resume " + checkpoint +
                       " alone continues the job of its checkpoint directory's job.toml, and "
                       "there is none; give the job's flags (or --config FILE) beside --resume");
  }
  JobConfig config;
  read_job_file(*file, config, Command::kTrain);
  config.checkpoint.resume = checkpoint;
  return config;
}

}  // namespace pipetrain::job
