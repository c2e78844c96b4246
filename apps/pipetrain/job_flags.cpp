// CLI11 options from the job's field declaration (job_flags.h).
#include "job_flags.h"

#include <iostream>
#include <map>

#include "pipetrain/job/deepspeed_config.h"
#include "pipetrain/job/job_fields.h"
#include "pipetrain/job/job_file.h"

namespace pipetrain::cli {
namespace {

// The job commands by subcommand name, for --config.
std::map<std::string, std::weak_ptr<JobCommand>>& job_commands() {
  static std::map<std::string, std::weak_ptr<JobCommand>> commands;
  return commands;
}

// An option per field of one command, bound to the field.
class AddOptions : public job::TypedFieldVisitor<AddOptions> {
 public:
  AddOptions(CLI::App& app, job::Command command) : app_(app), command_(command) {}

  template <typename T, typename C>
  void on(const job::Field& f, T& value, const C&) {
    if (!f.serves(command_)) return;
    CLI::Option* option = nullptr;
    if constexpr (std::is_same_v<T, bool>) {
      option = app_.add_flag(f.flag, value, f.help);
    } else if constexpr (job::IsOptional<T>::value) {
      using V = typename T::value_type;
      option = app_.add_option_function<V>(
          f.flag, [&value](const V& given) { value = given; }, f.help);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (f.implicit.empty()) {
        option = app_.add_option(f.flag, value, f.help);
      } else {  // the flag alone means f.implicit
        option = app_.add_option_function<std::string>(
                         f.flag,
                         [&value, implicit = f.implicit](const std::string& given) {
                           value = given.empty() || given == "true" ? implicit : given;
                         },
                         f.help)
                     ->expected(0, 1);
      }
    } else {
      option = app_.add_option(f.flag, value, f.help);
      if (f.delimiter) option->delimiter(f.delimiter);
    }
    if (f.hidden) {
      option->group("");
      return;
    }
    option->group(job::section_title(f.section));
    if constexpr (std::is_same_v<T, std::string>) {
      if (!f.implicit.empty()) {
        // CLI11 hands the flag alone its default text: the implicit value, while --help shows
        // the real default.
        option->default_str(f.implicit)->option_text("TEXT=" + value);
        return;
      }
    }
    if (!f.shown_default.empty()) {
      option->default_str(f.shown_default);
    } else if (option->get_type_size_max() > 0) {
      option->capture_default_str();
    }
  }

 private:
  CLI::App& app_;
  job::Command command_;
};

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

}  // namespace

std::shared_ptr<JobCommand> add_job_flags(CLI::App& app, job::Command command) {
  auto job = std::make_shared<JobCommand>();
  job->command = command;
  job->app = &app;
  AddOptions add(app, command);
  job::visit_fields(job->config, add);
  app.add_option("--config", job->config_file,
                 "TOML file of the job ([section] key = value, as --print-config "
                 "writes it; or JSON of flags {\"lr\": 0.01}); flags given here win")
      ->group("Job file");
  app.add_flag("--print-config", job->print_config,
               "print the whole job as TOML (every default filled) and exit; --config of that "
               "file runs the same job")
      ->group("Job file");
  if (command == job::Command::kTrain || command == job::Command::kPlanModel) {
    app.add_option("--deepspeed-config", job->deepspeed_config,
                   "DeepSpeed's ds_config.json: its batch, precision, optimizer, scheduler and "
                   "zero_optimization keys fill the job (\"auto\" from the flags and the model); "
                   "a flag given here must agree with it (docs/DEEPSPEED.md)")
        ->group("Job file");
  }
  app.add_flag("--reference-table", job->reference_table)->group("");
  job_commands()[app.get_name()] = job;
  return job;
}

std::vector<std::string> read_config_file(std::vector<std::string> arguments) {
  if (arguments.empty()) return arguments;
  const auto found = job_commands().find(arguments.front());
  if (found == job_commands().end()) return arguments;
  const std::shared_ptr<JobCommand> job = found->second.lock();
  if (!job) return arguments;
  for (size_t i = 1; i < arguments.size(); ++i) {
    std::string path;
    size_t words = 1;
    if (arguments[i] == "--config" && i + 1 < arguments.size()) {
      path = arguments[i + 1];
      words = 2;
    } else if (arguments[i].rfind("--config=", 0) == 0) {
      path = arguments[i].substr(9);
    } else {
      continue;
    }
    if (ends_with(path, ".json")) return arguments;  // flags (train/config_file.h)
    job->config_file = path;
    try {
      job::read_job_file(path, job->config, job->command);
    } catch (const pipetrain::Error& error) {
      throw BadInput(std::string("--config: ") + error.what());
    }
    arguments.erase(arguments.begin() + static_cast<std::ptrdiff_t>(i),
                    arguments.begin() + static_cast<std::ptrdiff_t>(i + words));
    return arguments;
  }
  return arguments;
}

void apply_deepspeed_config(JobCommand& job) {
  if (job.deepspeed_config.empty()) return;
  std::vector<std::string> given;
  const std::vector<job::Field> fields = job::fields_of(job.command);
  for (const std::string& flag : given_flags(*job.app)) {
    for (const job::Field& field : fields) {
      if (field.flag == flag) given.push_back(field.name());
    }
  }
  const job::DeepSpeedReading reading =
      job::read_deepspeed_config(job.deepspeed_config, job.config, job.command, given);
  for (const std::string& note : reading.notes) {
    std::cerr << "deepspeed config: " << note << "\n";
  }
  if (!reading.ignored.empty()) {
    std::cerr << "deepspeed config: warning: these keys change nothing in pipetrain:";
    for (const std::string& key : reading.ignored) std::cerr << " " << key;
    std::cerr << "\n";
  }
}

bool print_config_if_asked(const JobCommand& job) {
  if (job.reference_table) {
    std::cout << job::reference_table(job.command);
    return true;
  }
  if (!job.print_config) return false;
  job::check_fields(job.config, job.command);
  std::cout << job::job_toml(job.config, job.command);
  std::cout.flush();
  return true;
}

std::vector<std::string> given_flags(const CLI::App& app) {
  std::vector<std::string> given;
  for (const CLI::Option* option : app.get_options()) {
    const std::string name = option->get_name();
    if (option->count() > 0 && name != "--config" && name != "--print-config" &&
        name != "--reference-table" && name != "--deepspeed-config") {
      given.push_back(name);
    }
  }
  return given;
}

}  // namespace pipetrain::cli
