// The main of the fuzz_replay_<name> tests: runs a harness's LLVMFuzzerTestOneInput once on
// every file in the directories named on the command line (tests/fuzz/regressions/<name>
// and tests/fuzz/corpus/<name>), so the default suite replays every kept input with the
// project compiler, no libFuzzer needed. A broken property traps, which fails the test.
#include <algorithm>   // sort: a stable order for messages
#include <cstdint>     // uint8_t
#include <cstdio>      // printf, fprintf
#include <filesystem>  // directory listing
#include <fstream>     // reading each input
#include <iterator>    // istreambuf_iterator
#include <string>      // paths
#include <system_error>  // error_code of the listing
#include <vector>      // the inputs

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

namespace {

/**
 * The regular files in `dir`, sorted by name, leaving out hidden ones (.gitkeep keeps an
 * otherwise empty directory in git). False, with a message, when `dir` is not a directory.
 */
bool ListInputs(const std::filesystem::path &dir, std::vector<std::filesystem::path> *out) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    std::fprintf(stderr, "replay: '%s' is not a directory\n", dir.c_str());
    return false;
  }
  std::vector<std::filesystem::path> found;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->path().filename().string().starts_with(".")) continue;
    found.push_back(it->path());
  }
  if (ec) {
    std::fprintf(stderr, "replay: cannot list '%s': %s\n", dir.c_str(), ec.message().c_str());
    return false;
  }
  std::sort(found.begin(), found.end());
  out->insert(out->end(), found.begin(), found.end());
  return true;
}

/** The whole content of `path`; false when it cannot be read. */
bool ReadInput(const std::filesystem::path &path, std::vector<uint8_t> *out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

/** Replays every input of the directories given; non-zero when one is missing or unreadable. */
int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR...  (runs the harness once on every file in each DIR)\n",
                 argv[0]);
    return 2;
  }
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!ListInputs(argv[i], &inputs)) return 1;
  }
  std::vector<uint8_t> bytes;
  for (const std::filesystem::path &p : inputs) {
    if (!ReadInput(p, &bytes)) {
      std::fprintf(stderr, "replay: cannot read '%s'\n", p.c_str());
      return 1;
    }
    std::printf("replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
    std::fflush(stdout);  // the last line names the input if the harness traps on it
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("replay: ran %zu inputs from %d directories\n", inputs.size(), argc - 1);
  return 0;
}
