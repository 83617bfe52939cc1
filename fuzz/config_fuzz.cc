// libFuzzer target: the run configuration, as `loom train`, `loom plan` and `loom launch`
// read it: TOML text, then --section.key=value flags, then resolution, the typed config and
// the memory plan.
// The input is the TOML file, then (after the first NUL byte, if any) one flag per line.
// Properties: no crash and no library exception escaping (toml++'s included); a config
// that resolves plans its memory without overflow, and its to_toml() text reads back to
// the same config; anything else is an InputError naming the file or the flag.
#include <sstream>
#include <string>
#include <vector>

#include "config.h"
#include "config_train.h"
#include "reader_checks.h"

using namespace loom;
using namespace loom::app;

namespace {

// The config's sections ("job.", "model.", ...), read from the defaults' TOML text so that a
// section added later is known here too.
std::vector<std::string> config_sections() {
  std::vector<std::string> sections;
  std::istringstream lines{Config().to_toml()};
  for (std::string line; std::getline(lines, line);)
    if (line.size() > 2 && line.front() == '[' && line.back() == ']') sections.push_back(line.substr(1, line.size() - 2) + ".");
  return sections;
}

// Whether an error names the file, the flag or the key ("section.key") it is about.
bool names_its_source(const std::string& what, const std::string& path) {
  static const std::vector<std::string> sections = config_sections();
  if (what.starts_with(path) || what.starts_with("flag ")) return true;
  for (const std::string& section : sections)
    if (what.find(section) != std::string::npos) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz/config.toml";
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view toml = in.substr(0, nul);
  std::vector<std::string> flags;
  if (nul != std::string_view::npos) {
    std::istringstream lines{std::string(in.substr(nul + 1))};
    for (std::string line; std::getline(lines, line);) flags.push_back(line);
  }
  Config c;
  TrainConfig typed;
  int world = 1;
  try {
    c.merge_toml(toml, path);
    c.apply_overrides(flags);
    world = layout_ranks(c, 1);
    c.resolve(world);
    typed = train_config(c);
  } catch (const InputError& e) {
    if (!names_its_source(e.what(), path)) fuzz::finding("an error that names neither file, flag nor key", e.what());
    return 0;
  }
  const MemoryPlan plan = plan_memory(typed, world, {0});
  if (describe(plan).empty()) fuzz::finding("an empty memory plan", "");
  Config again;
  again.merge_toml(c.to_toml(), "fuzz/resolved.toml");
  again.resolve(world);
  if (again.to_toml() != c.to_toml()) fuzz::finding("to_toml() does not read back to the same config", c.to_toml());
  return 0;
}
