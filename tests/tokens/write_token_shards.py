#!/usr/bin/env python3
"""Writes token shards in the layouts tandem's data module reads, for its tests.

  write_token_shards.py llmc     OUT --count N --vocab V --stream S [--version 1|2] [--writer numpy|struct]
  write_token_shards.py nanogpt  OUT --count N --vocab V --stream S            (numpy, as prepare.py)
  write_token_shards.py megatron PREFIX --documents L1,L2,... --vocab V --stream S [--dtype uint16|int32]

Token i of a stream is (i * 7919 + stream * 131 + i // 7) % vocab, the numbers
tests/tokens/token_files.cc computes (for Megatron, i counts across the whole .bin).

Layouts:
  * llm.c (dev/data/data_common.py write_datafile): 256 little-endian int32, [0] = 20240520,
    [1] = version (1: uint16 tokens, 2: uint32), [2] = token count; then the tokens. With
    --writer numpy it is written the way llm.c writes it (a numpy int32 header, tobytes).
  * nanoGPT (data/*/prepare.py): np.array(ids, dtype=np.uint16).tofile(path).
  * Megatron-LM (megatron/core/datasets/indexed_dataset.py, _IndexWriter): PREFIX.bin holds
    the tokens; PREFIX.idx holds b"MMIDIDX\\x00\\x00", <Q 1, <B dtype code (8 uint16, 4 int32),
    <Q sequence count, <Q document-index count, int32 lengths, int64 byte pointers, int64
    document indices (0, then the sequence count after each document). One sequence a document.
"""
import argparse
import struct
import sys

LLMC_MAGIC = 20240520
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {"uint16": (8, "<H", 2), "int32": (4, "<i", 4)}


def tokens(stream, first, count, vocab):
    return [(i * 7919 + stream * 131 + i // 7) % vocab for i in range(first, first + count)]


def write_llmc(path, toks, version, writer):
    if writer == "numpy":
        import numpy as np
        header = np.zeros(256, dtype=np.int32)
        header[0] = LLMC_MAGIC
        header[1] = version
        header[2] = len(toks)
        toks_np = np.array(toks, dtype=np.uint16 if version == 1 else np.uint32)
        with open(path, "wb") as f:
            f.write(header.tobytes())
            f.write(toks_np.tobytes())
        return
    token_format = "<H" if version == 1 else "<I"
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", LLMC_MAGIC, version, len(toks)))
        f.write(b"\x00" * (1024 - 12))
        f.write(b"".join(struct.pack(token_format, t) for t in toks))


def write_nanogpt(path, toks):
    import numpy as np
    np.array(toks, dtype=np.uint16).tofile(path)


def write_megatron(prefix, lengths, vocab, stream, dtype):
    code, token_format, size = MEGATRON_DTYPES[dtype]
    toks = tokens(stream, 0, sum(lengths), vocab)
    with open(prefix + ".bin", "wb") as f:
        f.write(b"".join(struct.pack(token_format, t) for t in toks))
    pointers, pointer = [], 0
    for length in lengths:
        pointers.append(pointer)
        pointer += length * size
    document_indices = list(range(len(lengths) + 1))
    with open(prefix + ".idx", "wb") as f:
        f.write(MEGATRON_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(struct.pack("<%di" % len(lengths), *lengths))
        f.write(struct.pack("<%dq" % len(pointers), *pointers))
        f.write(struct.pack("<%dq" % len(document_indices), *document_indices))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=["llmc", "nanogpt", "megatron"])
    parser.add_argument("output")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--stream", type=int, default=0)
    parser.add_argument("--version", type=int, default=1, choices=[1, 2])
    parser.add_argument("--writer", default="struct", choices=["numpy", "struct"])
    parser.add_argument("--documents", default="")
    parser.add_argument("--dtype", default="uint16", choices=sorted(MEGATRON_DTYPES))
    args = parser.parse_args()
    if args.format == "llmc":
        write_llmc(args.output, tokens(args.stream, 0, args.count, args.vocab), args.version,
                   args.writer)
    elif args.format == "nanogpt":
        write_nanogpt(args.output, tokens(args.stream, 0, args.count, args.vocab))
    else:
        lengths = [int(x) for x in args.documents.split(",") if x]
        write_megatron(args.output, lengths, args.vocab, args.stream, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
