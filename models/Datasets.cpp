//===- Datasets.cpp - the LRA data layouts as token sequences -------------===//

#include "models/Datasets.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>

namespace spectra::data {
namespace {

[[noreturn]] void bad(const std::string &where, const std::string &what) {
  throw std::invalid_argument(where + ": " + what);
}

std::ifstream open(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    bad(path, std::string("cannot open (") + std::strerror(errno) + ")");
  return in;
}

/// The next line without its LF or CRLF ending.
bool nextLine(std::istream &in, std::string &line) {
  if (!std::getline(in, line))
    return false;
  if (!line.empty() && line.back() == '\r')
    line.pop_back();
  return true;
}

std::vector<std::string> splitTabs(const std::string &line) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1)
    fields.push_back(line.substr(start, tab - start));
  fields.push_back(line.substr(start));
  return fields;
}

std::vector<std::string> listFiles(const std::string &dir) {
  std::vector<std::string> files;
  DIR *d = opendir(dir.c_str());
  if (!d)
    bad(dir, std::string("cannot list the directory (") + std::strerror(errno) +
                 "); expected the aclImdb layout {train,test}/{pos,neg}/*.txt");
  while (dirent *e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0)
      files.push_back(dir + "/" + name);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

} // namespace

const std::vector<std::string> &listOpsVocabulary() {
  static const std::vector<std::string> vocab = {"<pad>", "0", "1", "2", "3", "4", "5", "6", "7",
                                                 "8", "9", "[MIN", "[MAX", "[MED", "[SM", "]"};
  return vocab;
}

std::vector<int32_t> tokenizeListOps(const std::string &source) {
  const std::vector<std::string> &vocab = listOpsVocabulary();
  std::vector<int32_t> ids;
  std::istringstream in(source);
  std::string token;
  while (in >> token) {
    if (token == "(" || token == ")")
      continue;
    auto it = std::find(vocab.begin() + 1, vocab.end(), token);
    if (it == vocab.end())
      throw std::invalid_argument("unknown ListOps token '" + token +
                                  "' (tokens: 0-9, [MIN, [MAX, [MED, [SM, ], parentheses)");
    ids.push_back(static_cast<int32_t>(it - vocab.begin()));
  }
  return ids;
}

std::vector<int32_t> encodeBytes(const std::string &text, int64_t maxLength) {
  size_t n = std::min<size_t>(text.size(), static_cast<size_t>(maxLength));
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i)
    ids[i] = static_cast<int32_t>(static_cast<unsigned char>(text[i])) + 1;
  return ids;
}

namespace {
/// Regular files under `path` (or `path` itself), recursively, sorted.
void collectFiles(const std::string &path, std::vector<std::string> &files) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    throw std::invalid_argument(path + ": " + std::strerror(errno));
  if (S_ISREG(st.st_mode)) {
    files.push_back(path);
    return;
  }
  if (!S_ISDIR(st.st_mode))
    return;
  DIR *dir = opendir(path.c_str());
  if (!dir)
    throw std::invalid_argument(path + ": cannot list: " + std::strerror(errno));
  std::vector<std::string> names;
  while (dirent *e = readdir(dir))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
      names.push_back(e->d_name);
  closedir(dir);
  std::sort(names.begin(), names.end());
  for (const std::string &n : names)
    collectFiles(path + "/" + n, files);
}
} // namespace

std::string readTextCorpus(const std::string &path) {
  std::vector<std::string> files;
  collectFiles(path, files);
  std::string bytes;
  for (const std::string &f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in)
      throw std::invalid_argument(f + ": cannot open for reading");
    std::stringstream text;
    text << in.rdbuf();
    if (!bytes.empty())
      bytes += '\n';
    bytes += text.str();
  }
  if (bytes.empty())
    throw std::invalid_argument(path + ": no text to read (a file, or a directory of files)");
  return bytes;
}

std::vector<Example> byteWindows(const std::string &bytes, int64_t window) {
  if (window < 1)
    throw std::invalid_argument("byte windows need a length >= 1, got " + std::to_string(window));
  std::vector<Example> out;
  for (size_t start = 0; start + window + 1 <= bytes.size(); start += window) {
    Example e;
    e.tokens = encodeBytes(bytes.substr(start, window + 1), window + 1);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<Example> loadListOpsTsv(const std::string &path, int64_t maxLength) {
  std::ifstream in = open(path);
  std::string line;
  if (!nextLine(in, line) || line != "Source\tTarget")
    bad(path + ":1", "expected the header 'Source<TAB>Target', got '" + line.substr(0, 60) + "'");
  std::vector<Example> out;
  for (int64_t number = 2; nextLine(in, line); ++number) {
    std::string where = path + ":" + std::to_string(number);
    if (line.empty())
      continue;
    std::vector<std::string> f = splitTabs(line);
    if (f.size() != 2)
      bad(where, "expected 2 tab-separated columns (Source, Target), got " + std::to_string(f.size()));
    if (f[1].size() != 1 || !std::isdigit(static_cast<unsigned char>(f[1][0])))
      bad(where, "Target must be a digit 0-9, got '" + f[1].substr(0, 20) + "'");
    Example e;
    try {
      e.tokens = tokenizeListOps(f[0]);
    } catch (const std::invalid_argument &err) {
      bad(where, err.what());
    }
    if (static_cast<int64_t>(e.tokens.size()) > maxLength)
      e.tokens.resize(maxLength);
    e.label = f[1][0] - '0';
    out.push_back(std::move(e));
  }
  if (out.empty())
    bad(path, "no examples");
  return out;
}

std::vector<Example> loadImdb(const std::string &root, const std::string &split, int64_t maxLength) {
  std::vector<Example> out;
  for (const auto &[sub, label] : {std::pair<std::string, int>{"neg", 0}, {"pos", 1}})
    for (const std::string &file : listFiles(root + "/" + split + "/" + sub)) {
      std::ifstream in = open(file);
      std::stringstream text;
      text << in.rdbuf();
      out.push_back({encodeBytes(text.str(), maxLength), {}, label});
    }
  if (out.empty())
    bad(root + "/" + split, "no documents in pos/ or neg/");
  return out;
}

std::vector<Example> loadAanTsv(const std::string &path, int64_t maxLength) {
  std::ifstream in = open(path);
  std::string line;
  std::vector<Example> out;
  for (int64_t number = 1; nextLine(in, line); ++number) {
    std::string where = path + ":" + std::to_string(number);
    if (line.empty())
      continue;
    std::vector<std::string> f = splitTabs(line);
    if (f.size() != 5)
      bad(where, "expected 5 tab-separated columns (label id1 id2 text1 text2), got " +
                     std::to_string(f.size()));
    char *end = nullptr;
    double label = std::strtod(f[0].c_str(), &end);
    if (f[0].empty() || *end != '\0' || (label != 0.0 && label != 1.0))
      bad(where, "label must be 0 or 1 (e.g. 1 or 1.0), got '" + f[0].substr(0, 20) + "'");
    out.push_back({encodeBytes(f[3], maxLength), encodeBytes(f[4], maxLength),
                   static_cast<int>(label)});
  }
  if (out.empty())
    bad(path, "no examples");
  return out;
}

} // namespace spectra::data
