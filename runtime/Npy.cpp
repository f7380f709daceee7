//===- Npy.cpp - NumPy .npy reading and writing --------------------------===//

#include "runtime/Npy.h"
#include "runtime/Paths.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace spectra {
namespace {

[[noreturn]] void bad(const std::string &path, const std::string &what) {
  throw std::runtime_error(path + ": " + what);
}

struct DType {
  const char *descr;
  torch::ScalarType type;
};
const DType kTypes[] = {{"<f4", torch::kFloat32}, {"<f8", torch::kFloat64},
                        {"<f2", torch::kFloat16}, {"<i4", torch::kInt32},
                        {"<i8", torch::kInt64},   {"|b1", torch::kBool},
                        {"|u1", torch::kUInt8}};

} // namespace

torch::Tensor readNpy(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    bad(path, "cannot open for reading");
  char magic[8];
  if (!in.read(magic, 8) || std::string(magic, 6) != "\x93NUMPY")
    bad(path, "not a .npy file (bad magic)");
  uint32_t headerLength = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char *>(b), 2);
    headerLength = b[0] | (b[1] << 8);
  } else if (magic[6] == 2 || magic[6] == 3) {
    unsigned char b[4];
    in.read(reinterpret_cast<char *>(b), 4);
    headerLength = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    bad(path, "unsupported .npy format version " + std::to_string(magic[6]));
  }
  std::string header(headerLength, '\0');
  if (!in.read(header.data(), headerLength))
    bad(path, "truncated header");

  std::smatch match;
  if (!std::regex_search(header, match, std::regex("'descr':\\s*'([^']*)'")))
    bad(path, "header has no 'descr'");
  std::string descr = match[1];
  // numpy writes Fortran order (first index fastest) for transposed arrays.
  bool fortran = std::regex_search(header, match, std::regex("'fortran_order':\\s*(True|False)")) &&
                 match[1] == "True";
  if (!std::regex_search(header, match, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    bad(path, "header has no 'shape'");
  std::vector<int64_t> shape;
  std::stringstream dims(match[1].str());
  for (std::string item; std::getline(dims, item, ',');) {
    item = std::regex_replace(item, std::regex("\\s+"), "");
    if (!item.empty())
      shape.push_back(std::stoll(item));
  }
  const DType *type = nullptr;
  for (const DType &t : kTypes)
    if (descr == t.descr)
      type = &t;
  if (!type)
    bad(path, "unsupported dtype '" + descr + "' (supported: <f2 <f4 <f8 <i4 <i8 |b1 |u1)");
  // Fortran order is C order of the reversed shape; the dimensions are reversed back.
  std::vector<int64_t> stored(shape);
  if (fortran)
    std::reverse(stored.begin(), stored.end());
  torch::Tensor t = torch::empty(stored, type->type);
  size_t bytes = t.numel() * t.element_size();
  if (!in.read(static_cast<char *>(t.data_ptr()), static_cast<std::streamsize>(bytes)))
    bad(path, "truncated data: expected " + std::to_string(bytes) + " bytes for shape " +
                  std::string(match[1]));
  if (!fortran || t.dim() < 2)
    return t;
  std::vector<int64_t> reversed(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i)
    reversed[i] = t.dim() - 1 - i;
  return t.permute(reversed).contiguous();
}

void writeNpy(const std::string &path, const torch::Tensor &tensor) {
  torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
  const DType *type = nullptr;
  for (const DType &d : kTypes)
    if (d.type == t.scalar_type())
      type = &d;
  if (!type)
    throw std::runtime_error(path + ": cannot write dtype " + std::string(c10::toString(t.scalar_type())));
  std::string shape;
  for (int64_t i = 0; i < t.dim(); ++i)
    shape += std::to_string(t.size(i)) + (t.dim() == 1 || i + 1 < t.dim() ? "," : "");
  std::string header = "{'descr': '" + std::string(type->descr) +
                       "', 'fortran_order': False, 'shape': (" + shape + "), }";
  // Pad so that the data starts at a multiple of 64 bytes.
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string error;
  if (!replaceAtomically(
          path,
          [&](const std::string &temporary) {
            std::ofstream out(temporary, std::ios::binary);
            out.write("\x93NUMPY\x01\x00", 8);
            unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                    static_cast<unsigned char>(header.size() >> 8)};
            out.write(reinterpret_cast<char *>(len), 2);
            out << header;
            out.write(static_cast<const char *>(t.data_ptr()),
                      static_cast<std::streamsize>(t.numel() * t.element_size()));
            return static_cast<bool>(out.flush());
          },
          &error))
    throw std::runtime_error(path + ": " + error);
}

} // namespace spectra
