//===- Paths.h - directory helpers shared by the runtime and the tools ----===//
//
// Header-only and POSIX (libtorch exports std::filesystem symbols that must not
// be bound from our code), so the data-only tools can use it without linking
// the runtime.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_PATHS_H
#define SPECTRA_RUNTIME_PATHS_H

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

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

/// Replaces `path` atomically (POSIX rename): `write` fills a temporary file beside it (a
/// name unique to this process and call), which is then renamed into place. A reader sees
/// the old file or the new one, never half of one. On failure the temporary is removed, and
/// false is returned with the reason in `error` when given; an exception from `write`
/// propagates after the cleanup.
inline bool replaceAtomically(const std::string &path,
                              const std::function<bool(const std::string &temporary)> &write,
                              std::string *error = nullptr) {
  static std::atomic<unsigned long long> counter{0};
  std::string temporary =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  bool written = false;
  try {
    written = write(temporary);
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
  if (!written) {
    std::remove(temporary.c_str());
    if (error)
      *error = "cannot write '" + temporary + "'";
    return false;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    if (error)
      *error = "cannot move '" + temporary + "' into place at '" + path + "': " + std::strerror(errno);
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

/// Writes `bytes` to `path` atomically (replaceAtomically).
inline bool writeFileAtomically(const std::string &path, const std::string &bytes,
                                std::string *error = nullptr) {
  return replaceAtomically(
      path,
      [&](const std::string &temporary) {
        std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        return static_cast<bool>(out.flush());
      },
      error);
}

} // namespace spectra

#endif // SPECTRA_RUNTIME_PATHS_H
