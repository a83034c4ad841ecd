// chi_test::TempFile: a file of given text under /tmp for the life of a test (runtime
// configuration files handed to a runtime through CHI_SERVER_CONF, mostly).
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>  // mkstemp
#include <unistd.h>  // write, close, unlink

#include <string>
#include <vector>

namespace chi_test {

/** A temporary file holding the given text, removed when the object dies. */
class TempFile {
 public:
  explicit TempFile(const std::string &text) {
    std::string tmpl = "/tmp/chi_test_" + std::string(6, 'X');  // mkstemp pattern
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    int fd = mkstemp(buf.data());
    REQUIRE(fd >= 0);
    path_ = buf.data();
    REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    close(fd);
  }
  ~TempFile() { unlink(path_.c_str()); }
  TempFile(const TempFile &) = delete;
  TempFile &operator=(const TempFile &) = delete;

  const std::string &path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace chi_test
