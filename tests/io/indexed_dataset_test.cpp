// Tests for Megatron's indexed datasets (include/pipetrain/io/indexed_dataset.h): files written by
// an independent Python writer of Megatron's layout read back as written, pipetrain's writer
// round-trips, and every damaged field is an error naming the file and the field.
#include "pipetrain/io/indexed_dataset.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/python.h"
#include "pipetrain/base/error.h"

namespace pipetrain::io::indexed_dataset_test {
namespace {

std::string scratch(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / "indexed";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The message of what opening `prefix` throws ("" when it opens).
std::string open_error(const std::string& prefix) {
  try {
    IndexedDataset data(prefix);
  } catch (const BadInput& error) {
    return error.what();
  }
  return "";
}

// Megatron's layout written by Python (numpy and struct, as megatron.core's _IndexWriter writes
// it): three documents, the second of two sequences (a sentence-split document), ids of `dtype`.
TEST(IndexedDataset, ReadsWhatAPythonWriterOfMegatronsLayoutWrote) {
  if (!testing::python_has_torch()) GTEST_SKIP() << testing::no_python_torch_message();
  for (const auto& [dtype, code, big] : std::vector<std::tuple<std::string, int, long long>>{
           {"uint16", 8, 65535}, {"int32", 4, 151935}}) {
    const std::string prefix = scratch("python_" + dtype);
    const std::string script = R"(
import struct, sys, numpy as np
prefix, dtype, code, big = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sequences = [[5, 6, 7], [8, big], [9], [10, 11, 12, 13]]
documents = [0, 1, 3, 4]
item = np.dtype(dtype).itemsize
pointers, at = [], 0
with open(prefix + ".bin", "wb") as f:
    for s in sequences:
        pointers.append(at)
        f.write(np.array(s, dtype=dtype).tobytes(order="C"))
        at += len(s) * item
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00")
    f.write(struct.pack("<Q", 1))
    f.write(struct.pack("<B", code))
    f.write(struct.pack("<Q", len(sequences)))
    f.write(struct.pack("<Q", len(documents)))
    f.write(np.array([len(s) for s in sequences], dtype=np.int32).tobytes(order="C"))
    f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
    f.write(np.array(documents, dtype=np.int64).tobytes(order="C"))
)";
    write_bytes(prefix + ".py", script);
    const std::string command = testing::kPython + " " + prefix + ".py " + prefix + " " + dtype +
                                " " + std::to_string(code) + " " + std::to_string(big);
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    const IndexedDataset data(prefix);
    EXPECT_EQ(to_string(data.dtype()), dtype);
    EXPECT_EQ(data.sequences(), 4);
    EXPECT_EQ(data.documents(), 3);
    EXPECT_EQ(data.tokens(), 10);
    EXPECT_TRUE(data.contiguous());
    const std::vector<std::vector<int64_t>> expected = {{5, 6, 7}, {8, big, 9}, {10, 11, 12, 13}};
    for (int64_t d = 0; d < 3; ++d) {
      std::vector<int64_t> ids;
      data.append_document(d, ids);
      EXPECT_EQ(ids, expected[static_cast<size_t>(d)]) << dtype << ", document " << d;
      EXPECT_EQ(data.document_length(d), static_cast<int64_t>(ids.size()));
    }
    // pipetrain's writer makes the same documents (one sequence each) with the same ids.
    write_indexed_dataset(prefix + "_again", expected,
                          code == 8 ? IndexedDtype::kUint16 : IndexedDtype::kInt32);
    EXPECT_EQ(read_bytes(prefix + "_again.bin"), read_bytes(prefix + ".bin")) << dtype;
    const IndexedDataset again(prefix + "_again");
    EXPECT_EQ(again.documents(), 3);
    EXPECT_EQ(again.sequences(), 3);
  }
}

// megatron-core's own builder (PyPI's megatron-core, installed by scripts/bootstrap without its
// dependencies): a document of two sequences among others, int32 and uint16 ids. Skips, saying
// so, where it does not import.
TEST(IndexedDataset, ReadsWhatMegatronCoresBuilderWrote) {
  if (!testing::python_has_torch()) GTEST_SKIP() << testing::no_python_torch_message();
  const std::string probe = testing::kPython +
                            " -W ignore -c 'import megatron.core.datasets.indexed_dataset' "
                            ">/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    GTEST_SKIP() << testing::kPython << " cannot import megatron.core (scripts/bootstrap installs "
                 << "megatron-core)";
  }
  // Both datasets from one interpreter (importing megatron.core takes seconds).
  const std::string base = scratch("megatron_");
  write_bytes(base + "make.py", R"(
import sys, warnings, numpy
warnings.simplefilter("ignore")
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
for name in ("int32", "uint16"):
    dtype = getattr(numpy, name)
    builder = IndexedDatasetBuilder(sys.argv[1] + name + ".bin", dtype=dtype)
    builder.add_document(numpy.array([5, 6, 7], dtype=dtype), [3])
    builder.add_document(numpy.array([8, 65535, 9], dtype=dtype), [2, 1])  # two sequences
    builder.add_document(numpy.array([10, 11, 12, 13], dtype=dtype), [4])
    builder.finalize(sys.argv[1] + name + ".idx")
)");
  const std::string command =
      testing::kPython + " " + base + "make.py " + base + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  for (const std::string dtype : {"int32", "uint16"}) {
    const std::string prefix = base + dtype;
    const IndexedDataset data(prefix);
    EXPECT_EQ(to_string(data.dtype()), dtype);
    EXPECT_EQ(data.sequences(), 4);
    EXPECT_EQ(data.documents(), 3);
    EXPECT_TRUE(data.contiguous());
    const std::vector<std::vector<int64_t>> expected = {{5, 6, 7}, {8, 65535, 9}, {10, 11, 12, 13}};
    for (int64_t d = 0; d < 3; ++d) {
      std::vector<int64_t> ids;
      data.append_document(d, ids);
      EXPECT_EQ(ids, expected[static_cast<size_t>(d)]) << dtype << ", document " << d;
    }
  }
}

TEST(IndexedDataset, ADamagedIndexIsAnErrorNamingTheFileAndTheField) {
  const std::string prefix = scratch("good");
  write_indexed_dataset(prefix, {{1, 2, 3}, {4, 5}});
  const std::string good = read_bytes(prefix + ".idx");
  ASSERT_EQ(open_error(prefix), "");
  auto damaged = [&](const std::string& name, const std::string& bytes) {
    const std::string p = scratch(name);
    write_bytes(p + ".idx", bytes);
    std::filesystem::copy_file(prefix + ".bin", p + ".bin",
                               std::filesystem::copy_options::overwrite_existing);
    return open_error(p);
  };
  std::string bytes = good;
  bytes[0] = 'X';
  EXPECT_NE(damaged("magic", bytes).find("does not begin with MMIDIDX"), std::string::npos);
  bytes = good;
  bytes[9] = 2;
  EXPECT_NE(damaged("version", bytes).find("version 2; pipetrain reads version 1"),
            std::string::npos);
  bytes = good;
  bytes[17] = 7;
  EXPECT_NE(damaged("float", bytes).find("ids of dtype float32"), std::string::npos);
  bytes = good;
  bytes[17] = 12;
  EXPECT_NE(damaged("code", bytes).find("dtype code 12"), std::string::npos);
  EXPECT_NE(damaged("short", good.substr(0, good.size() - 4)).find("(truncated?)"),
            std::string::npos);
  EXPECT_NE(damaged("header", good.substr(0, 20)).find("fewer than its 34-byte header"),
            std::string::npos);
  bytes = good;
  bytes[bytes.size() - 8] = 3;  // the last document index: 3, not the sequence count 2
  const std::string last = damaged("documents", bytes);
  EXPECT_NE(last.find("document indices must run from 0 to the sequence count 2"),
            std::string::npos)
      << last;
  // A pointer past the end of the .bin names the sequence and the .bin.
  bytes = good;
  bytes[34 + 2 * 4 + 8] = 100;  // sequence 1's pointer
  const std::string outside = damaged("pointer", bytes);
  EXPECT_NE(outside.find("sequence 1 (2 ids at byte 100) lies outside"), std::string::npos)
      << outside;
  EXPECT_NE(outside.find("pointer.bin"), std::string::npos) << outside;
  // Every error names the index file.
  EXPECT_NE(damaged("named", good.substr(0, 20)).find("named.idx"), std::string::npos);
  // A missing file is a FileError naming it.
  try {
    IndexedDataset missing(scratch("absent"));
    ADD_FAILURE() << "opened a dataset that does not exist";
  } catch (const FileError& error) {
    EXPECT_NE(std::string(error.what()).find("absent.idx"), std::string::npos) << error.what();
  }
}

// Regression (found by fuzz_indexed_index): an index of no sequences copied its empty arrays
// through a null pointer (undefined behaviour under UBSan). It parses to no documents.
TEST(IndexedDataset, AnIndexOfNoSequencesParsesToNoDocuments) {
  write_indexed_dataset(scratch("empty"), {});
  const IndexedDataset data(scratch("empty"));
  EXPECT_EQ(data.sequences(), 0);
  EXPECT_EQ(data.documents(), 0);
  EXPECT_EQ(data.tokens(), 0);
}

TEST(IndexedDataset, AnIdItsDtypeCannotHoldIsRefusedByTheWriter) {
  EXPECT_THROW(write_indexed_dataset(scratch("big"), {{1, 70000}}, IndexedDtype::kUint16),
               BadInput);
  EXPECT_THROW(write_indexed_dataset(scratch("negative"), {{-1}}, IndexedDtype::kInt32), BadInput);
  write_indexed_dataset(scratch("wide"), {{1, 70000}}, IndexedDtype::kInt32);
  std::vector<int64_t> ids;
  IndexedDataset(scratch("wide")).append_document(0, ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 70000}));
}

// Bytes are skipped a block of 4096 at a time: a value outside within a whole block, in the part
// after the last whole block, in a later document, and none, each at its document and offset.
TEST(IndexedDataset, FirstOutsideNamesTheDocumentAndOffsetOfTheFirstValueOutside) {
  std::vector<std::vector<int64_t>> documents(3, std::vector<int64_t>(10000, 1));
  documents[0][0] = 0;
  documents[1][5000] = 2;  // inside the second whole block
  documents[1][9000] = 3;  // after it
  documents[2][9999] = 7;  // the last value
  write_indexed_dataset(scratch("bytes"), documents, IndexedDtype::kUint8);
  const IndexedDataset bytes(scratch("bytes"));
  auto found = bytes.first_outside(0, 1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->document, 1);
  EXPECT_EQ(found->offset, 5000);
  EXPECT_EQ(found->value, 2);
  found = bytes.first_outside(0, 2);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->document, 1);
  EXPECT_EQ(found->offset, 9000);
  EXPECT_EQ(found->value, 3);
  found = bytes.first_outside(1, 7);  // the 0 at the very start
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->document, 0);
  EXPECT_EQ(found->offset, 0);
  found = bytes.first_outside(0, 3);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->document, 2);
  EXPECT_EQ(found->offset, 9999);
  EXPECT_EQ(found->value, 7);
  EXPECT_FALSE(bytes.first_outside(0, 7).has_value());
  // Wider values: element by element, the same answer.
  write_indexed_dataset(scratch("words"), documents, IndexedDtype::kUint16);
  found = IndexedDataset(scratch("words")).first_outside(0, 1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->document, 1);
  EXPECT_EQ(found->offset, 5000);
}

}  // namespace
}  // namespace pipetrain::io::indexed_dataset_test
