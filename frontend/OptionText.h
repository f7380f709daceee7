//===- OptionText.h - NAME=VALUE component options, parsed and printed once ===//
//
// A variant's component and weight-recipe options travel as text: one
// NAME=VALUE per --option on the command lines, and "NAME=VALUE,..." through
// the compiler's C API. Header-only and standard C++ alone, so the C API, the
// tools and the LibTorch runtime (which includes no LLVM or MLIR header) read
// and write them the same way.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_FRONTEND_OPTIONTEXT_H
#define SPECTRA_FRONTEND_OPTIONTEXT_H

#include <cctype>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

namespace spectra {

/// Parses one NAME=VALUE with a numeric VALUE into `options`; "" on success, else
/// "expects NAME=VALUE with a number, got '<text>'" or "<NAME> takes a number, got '<VALUE>'".
inline std::string parseOption(const std::string &text, std::map<std::string, double> &options) {
  auto trim = [](const std::string &s) {
    size_t a = 0, b = s.size();
    while (a < b && std::isspace(static_cast<unsigned char>(s[a])))
      ++a;
    while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1])))
      --b;
    return s.substr(a, b - a);
  };
  size_t eq = text.find('=');
  std::string name = eq == std::string::npos ? "" : trim(text.substr(0, eq));
  std::string value = eq == std::string::npos ? "" : trim(text.substr(eq + 1));
  if (name.empty() || value.empty())
    return "expects NAME=VALUE with a number, got '" + text + "'";
  char *end = nullptr;
  double number = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size())
    return name + " takes a number, got '" + value + "'";
  options[name] = number;
  return "";
}

/// Parses "NAME=VALUE,NAME=VALUE,..." (empty items skipped); "" or the first error.
inline std::string parseOptionList(const std::string &list, std::map<std::string, double> &options) {
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.find_first_not_of(" \t") == std::string::npos)
      continue;
    if (std::string error = parseOption(item, options); !error.empty())
      return error;
  }
  return "";
}

/// "NAME=VALUE,..." in name order, with 17 significant digits (parses back exactly).
inline std::string formatOptionList(const std::map<std::string, double> &options) {
  std::ostringstream text;
  text.precision(17);
  for (const auto &[name, value] : options)
    text << (text.tellp() > 0 ? "," : "") << name << "=" << value;
  return text.str();
}

} // namespace spectra

#endif // SPECTRA_FRONTEND_OPTIONTEXT_H
