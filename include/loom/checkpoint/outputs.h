// Where a command may write (docs/security.md, "Outputs"): nothing a user owns is written
// over by a command that did not make it. A command that writes a file or a checkpoint
// checks its output here before it reads anything, and refuses, naming both paths, an
// output that
// - lies in a run directory or a locked checkpoint directory (one holding `.lock`), which
//   only that run's own job writes;
// - is one of its inputs, lies inside one, or holds one;
// - exists and is not what the command writes: not a regular file (a FIFO, a device, a
//   socket, a directory, a link) for a file, or a training run's checkpoints for a root.
// Thread-safety: reentrant.
#pragma once

#include <string>
#include <vector>

namespace loom::checkpoint {

// The run or checkpoint directory holding `.lock` that `path` is or lies in; "" for none.
std::string locked_dir_holding(const std::string& path);

// A file the command writes (`flag` names it in errors, e.g. "--out"), read from `inputs`.
void check_output_file(const std::string& flag, const std::string& out, const std::vector<std::string>& inputs);

// A checkpoint root the command writes step_0 into (prune, quantize): the checks above, and
// an existing root may hold only what such a command wrote (`latest` naming step_0).
void check_output_root(const std::string& flag, const std::string& out, const std::vector<std::string>& inputs);

// Where a job writes (`out`, named by `out_flag`) apart from what it reads (`in`, named by
// `in_flag`): neither is, nor lies inside, the other. E.g. --init-from and the job's
// checkpoints, which pruning would otherwise remove.
void check_apart(const std::string& in_flag, const std::string& in, const std::string& out_flag, const std::string& out);

// A training job's separate checkpoint.dir: refused inside another run's directory.
// `run`: the job's own run directory.
void check_checkpoint_dir(const std::string& dir, const std::string& run);

}  // namespace loom::checkpoint
