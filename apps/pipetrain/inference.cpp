// The commands that read a model or a checkpoint without training it: `eval`, `generate`,
// `export-hf` (job commands: job_flags.h, job/run_job.h) and `checkpoint-info`.
//
//   pipetrain eval --checkpoint run [--data fashion-mnist] [--model cnn] [--batch-size 1000]
//   pipetrain eval --model DIR --data tokens|indexed ... [--checkpoint C] [--stages K]
//   pipetrain generate --model DIR --prompt-tokens 1,2,3 --max-new-tokens N [--stages K]
//   pipetrain export-hf CHECKPOINT OUT [--dtype float32|bfloat16|float16]
//   pipetrain checkpoint-info DIR
//
// Exit codes (commands.h): 0, 2 for bad input (a model or checkpoint that does not fit, a prompt
// id outside the vocabulary).
#include <cstdio>

#include "commands.h"
#include "job_flags.h"
#include "pipetrain/job/console_observer.h"
#include "pipetrain/job/run_job.h"
#include "pipetrain/train/sharded_checkpoint.h"

namespace pipetrain::cli {
namespace {

using Run = job::JobResult (*)(const job::JobConfig&, job::JobObserver&);

void add_job_command(CLI::App& app, int& exit_code, const char* name, const char* description,
                     job::Command kind, Run run) {
  auto* command = app.add_subcommand(name, description);
  std::shared_ptr<JobCommand> job = add_job_flags(*command, kind);
  command->callback([job, run, &exit_code] {
    if (print_config_if_asked(*job)) {
      exit_code = 0;
      return;
    }
    job::ConsoleObserver console;
    exit_code = run(job->config, console).exit_code;
  });
}

}  // namespace

void add_eval_command(CLI::App& app, int& exit_code) {
  add_job_command(app, exit_code, "eval",
                  "evaluate a checkpoint of `pipetrain train` on the test data, or a Hugging Face "
                  "model on a token file (loss, perplexity)",
                  job::Command::kEval, job::run_evaluation);
}

void add_generate_command(CLI::App& app, int& exit_code) {
  add_job_command(app, exit_code, "generate",
                  "greedy decoding with a Hugging Face model through the pipeline",
                  job::Command::kGenerate, job::run_generation);
}

void add_export_hf_command(CLI::App& app, int& exit_code) {
  add_job_command(app, exit_code, "export-hf",
                  "write a pipetrain checkpoint of a Hugging Face model as transformers saves it "
                  "(safetensors, config.json)",
                  job::Command::kExportHf, job::run_export);
}

void add_checkpoint_info_command(CLI::App& app, int& exit_code) {
  auto path = std::make_shared<std::string>();
  auto* command = app.add_subcommand(
      "checkpoint-info",
      "print what a sharded checkpoint holds (step, the layout it was written at, tensors, bytes "
      "by file) from its index, without loading it");
  command->add_option("DIR", *path, "DIR/step-N, or DIR (its latest)")->required();
  command->callback([path, &exit_code] {
    const std::string text =
        as_bad_input("DIR " + *path, [&] { return train::describe_sharded_checkpoint(*path); });
    std::printf("%s", text.c_str());
    exit_code = 0;
  });
}

}  // namespace pipetrain::cli
