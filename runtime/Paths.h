//===- Paths.h - directory helpers shared by the runtime and the tools ----===//
//
// Header-only and POSIX (libtorch exports std::filesystem symbols that must not
// be bound from our code), so the data-only tools can use it without linking
// the runtime.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_PATHS_H
#define SPECTRA_RUNTIME_PATHS_H

#include <cerrno>
#include <cstring>
#include <string>
#include <sys/stat.h>

namespace spectra {

/// mkdir -p. On failure returns false and, when `error` is given, says which directory and why.
inline bool makeDirectories(const std::string &path, std::string *error = nullptr) {
  std::string partial = !path.empty() && path[0] == '/' ? "/" : "";
  for (size_t start = 0; start <= path.size();) {
    size_t end = path.find('/', start);
    if (end == std::string::npos)
      end = path.size();
    if (end > start) {
      partial += path.substr(start, end - start) + "/";
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        if (error)
          *error = "cannot create directory '" + partial + "': " + std::strerror(errno);
        return false;
      }
    }
    start = end + 1;
  }
  return true;
}

} // namespace spectra

#endif // SPECTRA_RUNTIME_PATHS_H
