"""Tokenize a JSONL file into a Megatron indexed dataset (PREFIX.idx + PREFIX.bin) for
`pipetrain train --data indexed --data-path PREFIX` (docs/MODELS.md, "Indexed datasets").

Run it as scripts/prepare-data (which picks the project's venv interpreter):

  scripts/prepare-data --input corpus.jsonl --tokenizer MODEL_DIR --output-prefix corpus \
      [--workers 4] [--fields text | --fields prompt,completion]

Each line of the input is a JSON object.
  text records (--fields text, the default): the tokenizer's encoding of record["text"] (its
      special tokens as its post-processor adds them, e.g. a BOS), then the EOS id; one document.
  prompt/completion records (--fields prompt,completion): the encoding of the prompt, then of the
      completion without special tokens, then EOS; one document. A second dataset,
      PREFIX_loss_mask (uint8, the same layout), holds 1 where the token is to be learned (the
      completion and its EOS) and 0 for the prompt.
The ids are uint16 when the vocabulary has fewer than 65500 entries, else int32 (Megatron's rule).
The EOS id is config.json's eos_token_id (the first, when a list) in MODEL_DIR, else
--eos-id. Files are written under temporary names and renamed into place at the end, so a dataset
is complete or absent. Progress (records and ids per second) goes to stderr.
"""

import argparse
import json
import multiprocessing
import os
import struct
import sys
import time

import numpy
from tokenizers import Tokenizer

MAGIC = b"MMIDIDX\x00\x00"
CODES = {numpy.dtype(numpy.uint8): 1, numpy.dtype(numpy.int32): 4, numpy.dtype(numpy.uint16): 8}

_tokenizer = None
_fields = None
_eos = None


def _start(tokenizer_path, fields, eos):
    global _tokenizer, _fields, _eos
    _tokenizer = Tokenizer.from_file(tokenizer_path)
    _fields = fields
    _eos = eos


def _encode(numbered_line):
    """(line number, ids, mask or None) of one JSONL line; None for a blank line."""
    number, line = numbered_line
    if not line.strip():
        return number, None, None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"line {number}: not JSON ({error})") from None
    for field in _fields:
        if not isinstance(record.get(field), str):
            raise ValueError(f"line {number}: no string field '{field}'")
    if len(_fields) == 1:
        ids = _tokenizer.encode(record[_fields[0]]).ids + [_eos]
        return number, ids, None
    prompt = _tokenizer.encode(record[_fields[0]]).ids
    completion = _tokenizer.encode(record[_fields[1]], add_special_tokens=False).ids + [_eos]
    return number, prompt + completion, [0] * len(prompt) + [1] * len(completion)


class _Writer:
    """One indexed dataset, its .bin streamed, its .idx written at close."""

    def __init__(self, prefix, dtype):
        self.prefix = prefix
        self.dtype = numpy.dtype(dtype)
        self.bin = open(prefix + ".bin.tmp", "wb")
        self.lengths = []

    def add(self, values):
        self.bin.write(numpy.asarray(values, dtype=self.dtype).tobytes(order="C"))
        self.lengths.append(len(values))

    def close(self):
        self.bin.flush()
        os.fsync(self.bin.fileno())
        self.bin.close()
        lengths = numpy.asarray(self.lengths, dtype=numpy.int32)
        pointers = numpy.zeros(len(lengths), dtype=numpy.int64)
        if len(lengths) > 1:
            pointers[1:] = numpy.cumsum(lengths[:-1], dtype=numpy.int64) * self.dtype.itemsize
        with open(self.prefix + ".idx.tmp", "wb") as index:
            index.write(MAGIC)
            index.write(struct.pack("<Q", 1))
            index.write(struct.pack("<B", CODES[self.dtype]))
            index.write(struct.pack("<Q", len(lengths)))
            index.write(struct.pack("<Q", len(lengths) + 1))
            index.write(lengths.tobytes(order="C"))
            index.write(pointers.tobytes(order="C"))
            index.write(numpy.arange(len(lengths) + 1, dtype=numpy.int64).tobytes(order="C"))
            index.flush()
            os.fsync(index.fileno())
        os.replace(self.prefix + ".bin.tmp", self.prefix + ".bin")
        os.replace(self.prefix + ".idx.tmp", self.prefix + ".idx")


def _discard(*writers):
    """Removes what unfinished writers wrote (a failed run leaves nothing behind)."""
    for writer in writers:
        if writer is not None:
            writer.bin.close()
            os.remove(writer.prefix + ".bin.tmp")


def _tokenizer_and_eos(path, eos_id):
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    tokenizer_path = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(tokenizer_path):
        sys.exit(f"prepare-data: no tokenizer at {tokenizer_path}")
    eos = eos_id
    config = os.path.join(directory, "config.json")
    if eos is None and os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            value = json.load(f).get("eos_token_id")
        eos = value[0] if isinstance(value, list) else value
    if eos is None:
        sys.exit(f"prepare-data: no eos_token_id in {config}; give --eos-id")
    return tokenizer_path, int(eos)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="a JSONL file, one record per line")
    parser.add_argument("--tokenizer", required=True,
                        help="a model directory (its tokenizer.json and config.json) or a "
                             "tokenizer.json")
    parser.add_argument("--output-prefix", required=True, help="writes PREFIX.idx and PREFIX.bin")
    parser.add_argument("--fields", default="text",
                        help="text (default), or prompt,completion: the records' fields")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 1)),
                        help="tokenizing processes (default: the machine's cores)")
    parser.add_argument("--eos-id", type=int, default=None,
                        help="the id ending each document (default: config.json's eos_token_id)")
    args = parser.parse_args()
    fields = args.fields.split(",")
    if len(fields) not in (1, 2) or not all(fields):
        sys.exit("prepare-data: --fields is one field (text) or two (prompt,completion)")
    if args.workers < 1:
        sys.exit(f"prepare-data: --workers must be at least 1, got {args.workers}")
    tokenizer_path, eos = _tokenizer_and_eos(args.tokenizer, args.eos_id)
    vocabulary = Tokenizer.from_file(tokenizer_path).get_vocab_size(with_added_tokens=True)
    dtype = numpy.uint16 if vocabulary < 65500 else numpy.int32
    ids_out = _Writer(args.output_prefix, dtype)
    mask_out = _Writer(args.output_prefix + "_loss_mask", numpy.uint8) if len(fields) == 2 else None

    start = time.monotonic()
    shown = start
    records = tokens = 0
    with open(args.input, encoding="utf-8") as lines, multiprocessing.Pool(
            args.workers, _start, (tokenizer_path, fields, eos)) as pool:
        try:
            for _, ids, mask in pool.imap(_encode, enumerate(lines, 1), chunksize=64):
                if ids is None:
                    continue
                ids_out.add(ids)
                if mask_out is not None:
                    mask_out.add(mask)
                records += 1
                tokens += len(ids)
                now = time.monotonic()
                if now - shown >= 1:
                    shown = now
                    print(f"\rprepare-data: {records} records, {tokens} ids, "
                          f"{records / (now - start):.0f} records/s", end="", file=sys.stderr)
        except ValueError as error:
            _discard(ids_out, mask_out)
            sys.exit(f"prepare-data: {args.input}: {error}")
    if records == 0:
        _discard(ids_out, mask_out)
        sys.exit(f"prepare-data: {args.input} holds no records")
    ids_out.close()
    if mask_out is not None:
        mask_out.close()
    seconds = time.monotonic() - start
    print(f"\rprepare-data: {records} documents, {tokens} ids ({numpy.dtype(dtype).name}) in "
          f"{seconds:.1f} s -> {args.output_prefix}.idx/.bin"
          + (f" and {args.output_prefix}_loss_mask.idx/.bin" if mask_out else ""),
          file=sys.stderr)


if __name__ == "__main__":
    main()
