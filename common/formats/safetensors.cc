#include "common/formats/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace pw {
namespace {

using json = nlohmann::json;

// Deepest JSON nesting a valid header needs is 3 (root, tensor entry, shape array).
constexpr int kMaxJsonDepth = 8;
// Caps that keep numel and byte counts far from 64-bit overflow.
constexpr int64_t kMaxNumel = int64_t{1} << 56;
constexpr size_t kMaxRank = 64;

struct HeaderRejected : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Quote(std::string_view s) {
  std::string out = "'";
  // Bound what a hostile name can add to a message.
  out.append(s.substr(0, 200));
  if (s.size() > 200) out += "...";
  out += "'";
  return out;
}

uint64_t ReadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A JSON value as a non-negative integer that fits in int64; false otherwise.
bool AsNonNegative(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = u;
    return true;
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = static_cast<uint64_t>(i);
    return true;
  }
  return false;
}

Status ValidateEntry(std::string_view label, const std::string& name, const json& v,
                     uint64_t data_size, uint64_t data_start, SafetensorsEntry* out) {
  auto err = [&](StatusCode code, const std::string& what) {
    return Status(code, std::string(label) + ": tensor " + Quote(name) + ": " + what);
  };
  if (name.empty()) return Corrupt(std::string(label) + ": a tensor has an empty name");
  if (!v.is_object()) return err(StatusCode::kCorrupt, "entry is not a JSON object");

  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) {
    return err(StatusCode::kCorrupt, "field 'dtype' missing or not a string");
  }
  const std::string& dtype_name = dt->get_ref<const std::string&>();
  auto dtype = DTypeFromName(dtype_name);
  if (!dtype) return err(StatusCode::kUnsupported, "unknown dtype " + Quote(dtype_name));

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) {
    return err(StatusCode::kCorrupt, "field 'shape' missing or not an array");
  }
  if (sh->size() > kMaxRank) {
    return err(StatusCode::kCorrupt, "field 'shape' has rank " + std::to_string(sh->size()) +
                                         " (at most " + std::to_string(kMaxRank) + ")");
  }
  std::vector<int64_t> shape;
  int64_t numel = 1;
  bool zero = false;
  for (size_t i = 0; i < sh->size(); ++i) {
    uint64_t d;
    if (!AsNonNegative((*sh)[i], &d)) {
      return err(StatusCode::kCorrupt,
                 "field 'shape[" + std::to_string(i) + "]' is not a non-negative integer");
    }
    shape.push_back(static_cast<int64_t>(d));
    if (d == 0) zero = true;
  }
  if (!zero) {
    for (int64_t d : shape) {
      if (d > kMaxNumel / numel) {
        return err(StatusCode::kCorrupt, "shape " + ShapeToString(shape) + " overflows");
      }
      numel *= d;
    }
  } else {
    numel = 0;
  }

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2) {
    return err(StatusCode::kCorrupt, "field 'data_offsets' missing or not an array of 2");
  }
  uint64_t begin, end;
  if (!AsNonNegative((*off)[0], &begin) || !AsNonNegative((*off)[1], &end)) {
    return err(StatusCode::kCorrupt, "field 'data_offsets' holds a non-integer or negative value");
  }
  if (begin > end) {
    return err(StatusCode::kCorrupt, "data_offsets [" + std::to_string(begin) + ", " +
                                         std::to_string(end) + ") has begin > end");
  }
  if (end > data_size) {
    return err(StatusCode::kCorrupt, "data_offsets [" + std::to_string(begin) + ", " +
                                         std::to_string(end) + ") exceed the data section of " +
                                         std::to_string(data_size) + " bytes");
  }
  uint64_t want = static_cast<uint64_t>(numel) * DTypeSize(*dtype);  // < 2^59, no overflow
  if (end - begin != want) {
    return err(StatusCode::kCorrupt, "data_offsets span " + std::to_string(end - begin) +
                                         " bytes but dtype " + std::string(DTypeName(*dtype)) +
                                         " x shape " + ShapeToString(shape) + " needs " +
                                         std::to_string(want));
  }
  out->name = name;
  out->dtype = *dtype;
  out->shape = std::move(shape);
  out->offset = data_start + begin;
  out->nbytes = end - begin;
  return Status::Ok();
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                 std::string_view label) {
  const std::string lbl(label);
  if (size < 8) {
    return Corrupt(lbl + ": file is " + std::to_string(size) +
                   " bytes, too short for the 8-byte header length");
  }
  uint64_t n = ReadLe64(data);
  if (n > kSafetensorsMaxHeaderBytes) {
    return Corrupt(lbl + ": header length " + std::to_string(n) + " exceeds the cap of " +
                   std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  }
  if (n > size - 8) {
    return Corrupt(lbl + ": header length " + std::to_string(n) + " exceeds the file size " +
                   std::to_string(size) + " (truncated file?)");
  }
  if (n < 2) return Corrupt(lbl + ": header length " + std::to_string(n) + " is too small");
  const char* text = reinterpret_cast<const char*>(data + 8);

  json root;
  std::set<std::string> seen;
  try {
    json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
      if (depth > kMaxJsonDepth)
        throw HeaderRejected("JSON nested deeper than " + std::to_string(kMaxJsonDepth));
      if (ev == json::parse_event_t::key && depth == 1) {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!seen.insert(k).second) throw HeaderRejected("duplicate key " + Quote(k));
      }
      return true;
    };
    root = json::parse(text, text + n, cb);
  } catch (const HeaderRejected& e) {
    return Corrupt(lbl + ": header: " + e.what());
  } catch (const std::exception& e) {
    return Corrupt(lbl + ": header is not valid JSON: " + e.what());
  }
  if (!root.is_object()) return Corrupt(lbl + ": header is not a JSON object");

  SafetensorsHeader header;
  header.data_start = 8 + n;
  const uint64_t data_size = size - header.data_start;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Corrupt(lbl + ": '__metadata__' is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return Corrupt(lbl + ": '__metadata__." + m.key().substr(0, 200) + "' is not a string");
        }
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    PW_RETURN_IF_ERROR(
        ValidateEntry(label, it.key(), it.value(), data_size, header.data_start, &e));
    header.tensors.push_back(std::move(e));
  }
  // nlohmann's object keeps keys sorted; keep that order.

  // No two non-empty tensors may share a byte.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : header.tensors) {
    if (e.nbytes > 0) by_offset.push_back(&e);
  }
  std::sort(
      by_offset.begin(), by_offset.end(),
      [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsEntry* a = by_offset[i - 1];
    const SafetensorsEntry* b = by_offset[i];
    if (b->offset < a->offset + a->nbytes) {
      return Corrupt(lbl + ": tensors " + Quote(a->name) + " and " + Quote(b->name) +
                     " overlap in the data section");
    }
  }
  return header;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(std::unique_ptr<MmapFile> file, SafetensorsHeader header)
    : file_(std::move(file)), header_(std::move(header)) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path, FileLoad load) {
  PW_ASSIGN_OR_RETURN(auto file, MmapFile::Open(path, load));
  PW_ASSIGN_OR_RETURN(auto header, ParseSafetensorsHeader(file->data(), file->size(), path));
  return std::unique_ptr<SafetensorsFile>(new SafetensorsFile(std::move(file), std::move(header)));
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(header_.tensors.size());
  for (const auto& e : header_.tensors) names.push_back(e.name);
  return names;
}

bool SafetensorsFile::Has(std::string_view name) const { return index_.count(name) > 0; }

TensorView SafetensorsFile::ViewOf(const SafetensorsEntry& e) const {
  TensorView v;
  v.name = e.name;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.nbytes = e.nbytes;
  v.data = e.nbytes > 0 ? file_->data() + e.offset : nullptr;
  return v;
}

Result<TensorView> SafetensorsFile::Get(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return NotFound("missing tensor " + Quote(name) + " in " + path());
  }
  return ViewOf(header_.tensors[it->second]);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<std::string> ReadSmallFile(const std::string& path, size_t cap) {
  PW_ASSIGN_OR_RETURN(auto file, MmapFile::Open(path));
  if (file->size() > cap) {
    return InvalidArgument(path + ": " + std::to_string(file->size()) + " bytes, more than the " +
                           std::to_string(cap) + " allowed");
  }
  return std::string(reinterpret_cast<const char*>(file->data()), file->size());
}

// A shard name from an index must be a plain file name: no directories, no "..".
bool IsPlainFileName(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir, FileLoad load) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (FileExists(single)) {
    PW_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single, load));
    for (const auto& name : f->TensorNames()) ck->where_[name] = 0;
    ck->files_.push_back(std::move(f));
    return ck;
  }
  if (!FileExists(index_path)) {
    return NotFound(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  PW_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path, 64u << 20));
  json root;
  try {
    root = json::parse(text);
  } catch (const std::exception& e) {
    return Corrupt(index_path + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) return Corrupt(index_path + ": not a JSON object");
  auto wm = root.find("weight_map");
  if (wm == root.end() || !wm->is_object()) {
    return Corrupt(index_path + ": field 'weight_map' missing or not an object");
  }
  if (wm->empty()) return Corrupt(index_path + ": 'weight_map' is empty");
  std::map<std::string, size_t> shard_ids;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      return Corrupt(index_path + ": 'weight_map." + it.key().substr(0, 200) + "' is not a string");
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!IsPlainFileName(shard)) {
      return Corrupt(index_path + ": 'weight_map." + it.key().substr(0, 200) + "' names " +
                     Quote(shard) + ", which is not a file name inside the directory");
    }
    auto sid = shard_ids.find(shard);
    if (sid == shard_ids.end()) {
      const std::string shard_path = dir + "/" + shard;
      auto f = SafetensorsFile::Open(shard_path, load);
      if (!f.ok()) {
        return f.status().WithContext(index_path + ": shard " + Quote(shard) + " of tensor " +
                                      Quote(it.key()));
      }
      sid = shard_ids.emplace(shard, ck->files_.size()).first;
      ck->files_.push_back(std::move(f).value());
    }
    if (!ck->files_[sid->second]->Has(it.key())) {
      return Corrupt(index_path + ": 'weight_map' puts tensor " + Quote(it.key()) + " in " +
                     Quote(shard) + ", which does not contain it");
    }
    ck->where_[it.key()] = sid->second;
  }
  return ck;
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [name, idx] : where_) names.push_back(name);
  return names;
}

bool Checkpoint::Has(std::string_view name) const { return where_.find(name) != where_.end(); }

Result<TensorView> Checkpoint::Get(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return NotFound("missing tensor " + Quote(name) + " in " + dir_);
  return files_[it->second]->Get(name);
}

Result<TensorView> Checkpoint::Get(std::string_view name, DType dtype,
                                   const std::vector<int64_t>& shape) const {
  PW_ASSIGN_OR_RETURN(TensorView v, Get(name));
  if (v.dtype != dtype) {
    return InvalidArgument("tensor " + Quote(name) + " in " + dir_ + " has dtype " +
                           std::string(DTypeName(v.dtype)) + ", expected " +
                           std::string(DTypeName(dtype)));
  }
  if (v.shape != shape) {
    return InvalidArgument("tensor " + Quote(name) + " in " + dir_ + " has shape " +
                           ShapeToString(v.shape) + ", expected " + ShapeToString(shape));
  }
  return v;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->size();
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsWriter

Status SafetensorsWriter::Check(const std::string& name, DType dtype,
                                const std::vector<int64_t>& shape, size_t* nbytes) const {
  if (name.empty() || name == "__metadata__") {
    return InvalidArgument("safetensors writer: invalid tensor name " + Quote(name));
  }
  for (const auto& t : tensors_) {
    if (t.name == name)
      return InvalidArgument("safetensors writer: duplicate tensor " + Quote(name));
  }
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return InvalidArgument("safetensors writer: tensor " + Quote(name) + " has shape " +
                             ShapeToString(shape) + " with a negative dimension");
    }
    if (d != 0 && numel > kMaxNumel / d) {
      return InvalidArgument("safetensors writer: tensor " + Quote(name) + " shape overflows");
    }
    numel *= d;
  }
  *nbytes = static_cast<size_t>(numel) * DTypeSize(dtype);
  return Status::Ok();
}

Status SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                              const void* data, size_t nbytes) {
  size_t want;
  PW_RETURN_IF_ERROR(Check(name, dtype, shape, &want));
  if (nbytes != want) {
    return InvalidArgument("safetensors writer: tensor " + Quote(name) + " got " +
                           std::to_string(nbytes) + " bytes, dtype x shape needs " +
                           std::to_string(want));
  }
  Pending p{std::move(name), dtype, std::move(shape), nbytes, {}, nullptr};
  const auto* bytes = static_cast<const uint8_t*>(data);
  p.bytes.assign(bytes, bytes + nbytes);
  tensors_.push_back(std::move(p));
  return Status::Ok();
}

Status SafetensorsWriter::AddLazy(std::string name, DType dtype, std::vector<int64_t> shape,
                                  FillFn fill) {
  size_t want;
  PW_RETURN_IF_ERROR(Check(name, dtype, shape, &want));
  if (!fill) return InvalidArgument("safetensors writer: tensor " + Quote(name) + " has no fill");
  tensors_.push_back(Pending{std::move(name), dtype, std::move(shape), want, {}, std::move(fill)});
  return Status::Ok();
}

Status SafetensorsWriter::Write(const std::string& path) const {
  // Layout order: larger elements first, so each tensor starts at a multiple of its size.
  std::vector<const Pending*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const Pending* a, const Pending* b) {
    return DTypeSize(a->dtype) > DTypeSize(b->dtype);
  });
  json header = json::object();
  if (!metadata_.empty()) {
    json md = json::object();
    for (const auto& [k, v] : metadata_) md[k] = v;
    header["__metadata__"] = md;
  }
  uint64_t offset = 0;
  for (const Pending* t : order) {
    header[t->name] = {{"dtype", std::string(DTypeName(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->nbytes}}};
    offset += t->nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const std::exception& e) {  // invalid UTF-8 in a name or metadata
    return InvalidArgument(path + ": cannot encode header: " + e.what());
  }
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError(tmp + ": cannot create: " + std::strerror(errno));
  auto write_all = [&](const void* p, size_t n) -> bool {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd, b, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      b += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  };
  auto fail = [&](const std::string& what) {
    std::string msg = path + ": " + what + ": " + std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    return IoError(msg);
  };
  if (!write_all(len, 8) || !write_all(text.data(), text.size())) return fail("write header");
  std::vector<uint8_t> scratch;
  for (const Pending* t : order) {
    if (t->fill) {
      scratch.assign(t->nbytes, 0);
      t->fill(scratch.data(), t->nbytes);
      if (!write_all(scratch.data(), scratch.size())) return fail("write tensor " + t->name);
    } else if (!write_all(t->bytes.data(), t->bytes.size())) {
      return fail("write tensor " + t->name);
    }
  }
  if (::fsync(fd) != 0) return fail("fsync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return IoError(path + ": close: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string msg = path + ": rename from " + tmp + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return IoError(msg);
  }
  return Status::Ok();
}

}  // namespace pw
