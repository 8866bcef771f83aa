#!/usr/bin/env python3
"""Turns text into the token shards tandem's data module reads (data/token_dataset.h).

Reads documents (whole text files, their lines with --split-lines, or a field of JSON Lines
with --jsonl-field), tokenizes them with a Hugging Face tokenizer.json or, without one, a
byte-level BPE trained here on the corpus, appends the end-of-text token after every document,
and writes the tokens into shards of --shard-tokens tokens each, streaming: one batch of
documents is held at a time, never the corpus's tokens.
"""
import argparse
import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import sys
import time

PROGRAM = "prepare_data"

LLMC_MAGIC = 20240520
LLMC_HEADER_INTS = 256
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPE_CODES = {"uint16": 8, "int32": 4}
MAX_INT32 = 2**31 - 1
UINT16_VOCAB = 65536  # vocabularies up to this size fit uint16 tokens

TRAINED_EOS = "<|endoftext|>"
# End-of-text tokens looked for, in this order, in a given tokenizer.json (GPT-2 and most byte
# BPEs, Llama 3, SentencePiece conversions, Gemma).
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")

FORMATS = {"llmc": "llm.c", "megatron": "megatron", "nanogpt": "nanogpt"}
SPLITS = ("train", "valid")
PROGRESS_SECONDS = 10.0
BATCH_CHARACTERS = 8 << 20  # text encoded per batch
BATCH_DOCUMENTS = 4096

USAGE_EPILOG = """\
outputs, in --output DIR:
  train_000000.bin ...   training shards; valid_000000.bin ... validation shards (Megatron:
                         each .bin with its .idx). Shards hold --shard-tokens tokens each (the
                         last fewer); a document may continue into the next shard (Megatron
                         records each piece as a document of its shard).
  tokenizer.json         the tokenizer that made the tokens (the given file, byte for byte,
                         or the one trained here)
  dataset.json           vocab_size, eos id, tokens and documents per split, shard names,
                         source files, the tokenizer's origin, and the training tokens'
                         unigram entropy in nats (the loss a model that ignores context gets;
                         a language model's loss must go below it). Written last: present
                         means the run completed.
  Every file is written to a hidden temporary file and renamed into place, so no reader sees a
  half shard; a run that fails or is interrupted removes what it wrote. Give a reader the
  training shards by a pattern, 'DIR/train_*.bin': tandem's data module reads every *.bin of
  a bare DIR, validation shards included.

formats:
  llmc      llm.c: 256 int32 header [20240520, version, count, 0...], then the tokens;
            version 1 (uint16) when the vocabulary has at most 65536 tokens, else 2 (uint32)
  megatron  Megatron-LM indexed dataset: prefix.bin tokens, prefix.idx index; uint16 (dtype
            code 8) or int32 (code 4); one sequence per document, eos included
  nanogpt   headerless uint16 (vocabularies of at most 65536 tokens)

validation: --valid-documents K or --valid-fraction F (of the documents, at least one when
  F > 0) holds documents out, spread evenly through the corpus in input order (document i is
  held out when floor((i+1)*V/N) > floor(i*V/N)), so that a corpus of several books is not
  validated on one of them.

inputs: files (.gz, .bz2 and .xz read as compressed), and folders (every non-hidden file
  under them, in sorted path order). Text is UTF-8. A whole file is one document, held whole
  while it is encoded: split a corpus that is one huge file with --split-lines (blank lines
  are then skipped). Empty documents are skipped.

exit status: 0 done; 2 bad input or arguments (one line on stderr); 1 anything else.
"""


class InputError(Exception):
    """Bad input or arguments: reported as one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{PROGRAM}: error: {message} (see --help)\n")
        sys.exit(2)


def parse_arguments(argv):
    parser = ArgumentParser(
        prog="prepare_data.py",
        description=__doc__.strip(),
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="text files, folders of them, or JSON Lines files (--jsonl-field)")
    parser.add_argument("--output", "-o", required=True, metavar="DIR",
                        help="folder for the shards, tokenizer.json and dataset.json (made if "
                             "missing)")
    reading = parser.add_argument_group("documents")
    reading.add_argument("--split-lines", action="store_true",
                         help="one document per line, not per file")
    reading.add_argument("--jsonl-field", metavar="FIELD",
                         help="inputs are JSON Lines; each line's string FIELD is a document "
                              "(as a `datasets` export: --jsonl-field text)")
    tokenizing = parser.add_argument_group("tokenizer")
    tokenizing.add_argument("--tokenizer", metavar="FILE",
                            help="a Hugging Face tokenizer.json; without it a byte-level BPE "
                                 "is trained on the corpus (deterministic, no network)")
    tokenizing.add_argument("--vocab-size", type=int, default=4096, metavar="N",
                            help="the trained BPE's vocabulary size, end-of-text token "
                                 "included; at least 257 (default: %(default)s)")
    tokenizing.add_argument("--eos-token", metavar="TEXT",
                            help="the end-of-text token of a given tokenizer (default: the "
                                 f"first of {', '.join(EOS_CANDIDATES)} it knows)")
    tokenizing.add_argument("--special-tokens", action="store_true",
                            help="encode each document with the given tokenizer's template, "
                                 "as transformers' tokenizer(text) does (Llama's "
                                 "beginning-of-text token first, as Llama 3 was pretrained); "
                                 "default: the text's own tokens")
    writing = parser.add_argument_group("shards")
    writing.add_argument("--format", choices=sorted(FORMATS), default="llmc",
                         help="shard layout (default: %(default)s)")
    writing.add_argument("--shard-tokens", type=int, default=100_000_000, metavar="N",
                         help="tokens per shard, the last shard of a split fewer "
                              "(default: %(default)s)")
    validation = writing.add_mutually_exclusive_group()
    validation.add_argument("--valid-fraction", type=float, metavar="F",
                            help="hold out this fraction of the documents, 0 <= F < 1")
    validation.add_argument("--valid-documents", type=int, metavar="K",
                            help="hold out K documents")
    writing.add_argument("--overwrite", action="store_true",
                         help="replace the outputs of an earlier run in DIR (and remove its "
                              "shards that this run does not write)")
    parser.add_argument("--print-unigram-entropy", action="store_true",
                        help="print the training tokens' unigram entropy in nats on stdout "
                             "(it is in dataset.json either way)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress or summary lines on stderr")
    args = parser.parse_args(argv)

    if args.split_lines and args.jsonl_field is not None:
        parser.error("--split-lines and --jsonl-field exclude each other")
    if args.jsonl_field == "":
        parser.error("--jsonl-field needs a field name")
    if args.tokenizer is None and not 257 <= args.vocab_size <= MAX_INT32:
        raise InputError(f"--vocab-size {args.vocab_size} is too small: a byte-level BPE needs "
                         "256 byte tokens and the end-of-text token, at least 257"
                         if args.vocab_size < 257 else
                         f"--vocab-size {args.vocab_size} is over {MAX_INT32}")
    if args.special_tokens and args.tokenizer is None:
        raise InputError("--special-tokens needs --tokenizer (the trained tokenizer adds none)")
    if args.eos_token is not None and args.tokenizer is None:
        parser.error("--eos-token names the end-of-text token of a given --tokenizer")
    if not 1 <= args.shard_tokens <= MAX_INT32:
        parser.error(f"--shard-tokens must be between 1 and {MAX_INT32} (llm.c's int32 count), "
                     f"not {args.shard_tokens}")
    if args.valid_fraction is not None and not (0.0 <= args.valid_fraction < 1.0):
        parser.error(f"--valid-fraction must be in [0, 1), not {args.valid_fraction}")
    if args.valid_documents is not None and args.valid_documents < 0:
        parser.error(f"--valid-documents must be 0 or more, not {args.valid_documents}")
    return args


# ---- Inputs ----------------------------------------------------------------------------------

def open_text(path):
    """A text stream of a file, decompressing by suffix; newlines are kept as they are."""
    if path.endswith(".gz"):
        raw = gzip.open(path, "rb")
    elif path.endswith(".bz2"):
        raw = bz2.open(path, "rb")
    elif path.endswith(".xz"):
        raw = lzma.open(path, "rb")
    else:
        raw = open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="")


def resolve_sources(inputs):
    """The files the inputs name, in order (folders expanded), with their sizes in bytes."""
    sources = []
    seen = set()
    for given in inputs:
        if not os.path.exists(given):
            raise InputError(f"{given}: no such file or folder")
        if os.path.isdir(given):
            found = []
            for root, folders, files in os.walk(given):
                folders[:] = [f for f in folders if not f.startswith(".")]
                found.extend(os.path.join(root, f) for f in files if not f.startswith("."))
            found = sorted(p for p in found if os.path.isfile(p))
            if not found:
                raise InputError(f"{given}: the folder holds no files")
        elif os.path.isfile(given):
            found = [given]
        else:
            raise InputError(f"{given}: not a regular file or folder")
        for path in found:
            real = os.path.realpath(path)
            if real in seen:
                raise InputError(f"{path}: named twice among the inputs")
            seen.add(real)
            sources.append((path, os.path.getsize(path)))
    return sources


class Progress:
    """A line on stderr every PROGRESS_SECONDS while a pass runs, so short runs print none."""

    def __init__(self, quiet, total_bytes):
        self.quiet = quiet
        self.total_bytes = max(total_bytes, 1)
        self.start = time.monotonic()
        self.last = self.start

    def restart(self):
        self.start = self.last = time.monotonic()

    def update(self, what, bytes_done, extra=""):
        now = time.monotonic()
        if self.quiet or now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        rate = bytes_done / max(now - self.start, 1e-9) / 1e6
        line = (f"{PROGRAM}: {what}: {bytes_done / 1e6:.1f} of {self.total_bytes / 1e6:.1f} MB "
                f"({100.0 * bytes_done / self.total_bytes:.0f}%, {rate:.1f} MB/s){extra}")
        print(line, file=sys.stderr, flush=True)

    def say(self, line):
        if not self.quiet:
            print(f"{PROGRAM}: {line}", file=sys.stderr, flush=True)


class Corpus:
    """Iterates over the documents of the sources, counting them per source."""

    def __init__(self, sources, split_lines, jsonl_field):
        self.sources = sources
        self.split_lines = split_lines
        self.jsonl_field = jsonl_field
        self.bytes_done = 0  # of the current pass, as far as the compressed files allow
        self.documents_per_source = [0] * len(sources)

    def documents(self):
        finished_bytes = 0
        self.bytes_done = 0
        for index, (path, size) in enumerate(self.sources):
            count = 0
            characters = 0  # bytes read, near enough, for progress (capped: compressed files)
            for text in self._source_documents(path):
                count += 1
                characters += len(text)
                self.bytes_done = finished_bytes + min(characters, size)
                yield text
            self.documents_per_source[index] = count
            finished_bytes += size
            self.bytes_done = finished_bytes

    def _source_documents(self, path):
        try:
            with open_text(path) as stream:
                if self.jsonl_field is not None:
                    yield from self._jsonl_documents(path, stream)
                elif self.split_lines:
                    for line in stream:
                        line = line.rstrip("\r\n")
                        if line.strip():
                            yield line
                else:
                    text = stream.read()
                    if text:
                        yield text
        except UnicodeDecodeError as error:
            raise InputError(f"{path}: not UTF-8 text ({error.reason})") from None
        except (OSError, EOFError, lzma.LZMAError) as error:
            raise InputError(f"{path}: cannot read: {error}") from None

    def _jsonl_documents(self, path, stream):
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{path}:{number}: not JSON ({error.msg})") from None
            text = record.get(self.jsonl_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise InputError(f"{path}:{number}: no string field '{self.jsonl_field}'")
            if text:
                yield text


# ---- Tokenizer -------------------------------------------------------------------------------

def import_tokenizers():
    try:
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as error:
        print(f"{PROGRAM}: needs the Python packages numpy and tokenizers ({error}); "
              "scripts/python_env.sh makes an environment with them", file=sys.stderr)
        sys.exit(1)


def train_tokenizer(corpus, vocab_size, progress):
    """A byte-level BPE (GPT-2's pre-tokenization) trained on the corpus; <|endoftext|> is id 0.

    Deterministic: the trainer breaks ties between equally frequent pairs by the pair itself.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=[TRAINED_EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def texts():
        for text in corpus.documents():
            progress.update("training the tokenizer", corpus.bytes_done)
            yield text

    tokenizer.train_from_iterator(texts(), trainer=trainer)
    return tokenizer


def load_tokenizer(path):
    from tokenizers import Tokenizer
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except OSError as error:
        raise InputError(f"{path}: cannot read the tokenizer: {error.strerror}") from None
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # the library raises a bare Exception for a bad file
        raise InputError(f"{path}: not a Hugging Face tokenizer.json ({error})") from None
    # A tokenizer.json may carry a model's truncation and padding; shards want neither.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer, data


def find_eos(tokenizer, given, path):
    if given is not None:
        eos_id = tokenizer.token_to_id(given)
        if eos_id is None:
            raise InputError(f"{path}: the tokenizer has no token {given!r} (--eos-token)")
        return given, eos_id
    for candidate in EOS_CANDIDATES:
        eos_id = tokenizer.token_to_id(candidate)
        if eos_id is not None:
            return candidate, eos_id
    raise InputError(f"{path}: the tokenizer has none of the end-of-text tokens "
                     f"{', '.join(EOS_CANDIDATES)}; name its own with --eos-token")


def vocabulary_size(tokenizer):
    """One more than the largest token id (ids of added tokens included)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max(tokenizer.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)


# ---- Shards ----------------------------------------------------------------------------------

def write_atomically(path, data):
    temporary = temporary_path(path)
    try:
        with open(temporary, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        remove_quietly(temporary)
        raise


def temporary_path(path):
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.partial")  # hidden, and not *.bin: readers skip it


def remove_quietly(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class ShardWriter:
    """Writes one split's tokens into shards of `shard_tokens` tokens, one open shard at a time.

    Each shard is written under a temporary name and renamed when complete (Megatron: the .idx
    before the .bin, so that a .bin never stands without its index).
    """

    def __init__(self, folder, split, layout, token_dtype, shard_tokens):
        import numpy as np
        self.np = np
        self.folder = folder
        self.split = split
        self.layout = layout
        self.dtype = np.dtype(token_dtype).newbyteorder("<")
        self.shard_tokens = shard_tokens
        self.shards = []  # (file name, tokens, documents) of the completed shards
        self.tokens = 0
        self.stream = None
        self.stream_path = None
        self.shard_count = 0  # tokens in the open shard
        self.sequence_lengths = []  # Megatron: numpy arrays of the open shard's piece lengths

    def write(self, tokens, document_lengths):
        """Appends whole documents: `tokens` is their concatenation, eos included."""
        np = self.np
        ends = np.cumsum(document_lengths)
        position = 0
        while position < len(tokens):
            if self.stream is None:
                self._open()
            take = min(len(tokens) - position, self.shard_tokens - self.shard_count)
            chunk = tokens[position:position + take]
            self.stream.write(chunk.astype(self.dtype, copy=False).tobytes())
            if self.layout == "megatron":
                # Pieces of documents inside [position, position + take): cut at each document
                # end inside it; a document cut by the shard's end continues in the next one.
                inside = ends[(ends > position) & (ends < position + take)]
                cuts = np.concatenate(([position], inside, [position + take]))
                self.sequence_lengths.append(np.diff(cuts))
            position += take
            self.shard_count += take
            self.tokens += take
            if self.shard_count == self.shard_tokens:
                self._close()

    def finish(self):
        if self.stream is not None:
            self._close()

    def written_files(self):
        names = []
        for name, _, _ in self.shards:
            names.append(name)
            if self.layout == "megatron":
                names.append(name[:-len(".bin")] + ".idx")
        return names

    def abandon(self):
        """Removes the open shard's temporary file and every shard completed so far."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        # Whatever the moment of an interrupt (even between creating the temporary file and
        # holding its stream, or between closing and renaming it), the open shard's files go.
        if self.stream_path is not None:
            remove_quietly(self.stream_path)
            self.stream_path = None
            if self.layout == "megatron":  # an index renamed just before its .bin
                index_name = self._name(len(self.shards))[:-len(".bin")] + ".idx"
                remove_quietly(os.path.join(self.folder, index_name))
        for name in self.written_files():
            remove_quietly(os.path.join(self.folder, name))
        self.shards = []

    def _name(self, index):
        return f"{self.split}_{index:06d}.bin"

    def _open(self):
        name = self._name(len(self.shards))
        self.stream_path = temporary_path(os.path.join(self.folder, name))
        self.stream = open(self.stream_path, "wb")
        if self.layout == "llmc":
            self.stream.write(self._llmc_header(0))  # the count is filled in on closing
        self.shard_count = 0
        self.sequence_lengths = []

    def _llmc_header(self, count):
        header = self.np.zeros(LLMC_HEADER_INTS, dtype="<i4")
        header[0] = LLMC_MAGIC
        header[1] = 1 if self.dtype.itemsize == 2 else 2
        header[2] = count
        return header.tobytes()

    def _close(self):
        name = self._name(len(self.shards))
        path = os.path.join(self.folder, name)
        documents = 0
        if self.layout == "llmc":
            self.stream.seek(0)
            self.stream.write(self._llmc_header(self.shard_count))
        self.stream.flush()
        os.fsync(self.stream.fileno())
        self.stream.close()
        self.stream = None
        if self.layout == "megatron":
            lengths = self.np.concatenate(self.sequence_lengths)
            documents = len(lengths)
            write_atomically(path[:-len(".bin")] + ".idx", self._megatron_index(lengths))
        # Recorded before the rename: an interrupt at any point leaves a name abandon() removes.
        self.shards.append((name, self.shard_count, documents))
        os.replace(self.stream_path, path)
        self.stream_path = None

    def _megatron_index(self, lengths):
        """Megatron-LM's _IndexWriter layout, one sequence per document (piece)."""
        np = self.np
        count = len(lengths)
        code = MEGATRON_DTYPE_CODES["uint16" if self.dtype.itemsize == 2 else "int32"]
        pointers = np.zeros(count, dtype="<i8")
        np.cumsum(lengths[:-1] * self.dtype.itemsize, out=pointers[1:])
        document_indices = np.arange(count + 1, dtype="<i8")
        return b"".join([
            MEGATRON_MAGIC,
            (1).to_bytes(8, "little"),
            bytes([code]),
            count.to_bytes(8, "little"),
            (count + 1).to_bytes(8, "little"),
            lengths.astype("<i4").tobytes(),
            pointers.tobytes(),
            document_indices.tobytes(),
        ])


def held_out(index, valid_count, document_count):
    """Whether document `index` is a validation document: `valid_count` spread evenly."""
    return (index + 1) * valid_count // document_count > index * valid_count // document_count


def unigram_entropy(counts):
    """The entropy in nats of the distribution the token counts estimate."""
    import numpy as np
    total = counts.sum()
    if total == 0:
        return 0.0
    probabilities = counts[counts > 0] / total
    return float(-(probabilities * np.log(probabilities)).sum())


def earlier_outputs(folder):
    """Files in `folder` that an earlier run of this script wrote (or left half written)."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        base = name[1:-len(".partial")] if name.startswith(".") and name.endswith(".partial") \
            else name
        stem, _, extension = base.rpartition(".")
        split, underscore, number = stem.partition("_")
        if ((split in SPLITS and underscore and len(number) == 6 and number.isdigit() and
             extension in ("bin", "idx")) or base in ("dataset.json", "tokenizer.json")):
            found.append(name)
    return found


def prepare(args):
    import numpy as np
    import tokenizers

    sources = resolve_sources(args.inputs)
    total_bytes = sum(size for _, size in sources)
    corpus = Corpus(sources, args.split_lines, args.jsonl_field)
    progress = Progress(args.quiet, total_bytes)

    if args.tokenizer is not None:
        tokenizer, tokenizer_bytes = load_tokenizer(args.tokenizer)
        eos_token, eos_id = find_eos(tokenizer, args.eos_token, args.tokenizer)
        if args.special_tokens and (tokenizer.encode("a", add_special_tokens=True).ids ==
                                    tokenizer.encode("a", add_special_tokens=False).ids):
            raise InputError(f"{args.tokenizer}: --special-tokens: the tokenizer's "
                             "post-processor adds no special tokens")
        vocab = vocabulary_size(tokenizer)
        if args.format == "nanogpt" and vocab > UINT16_VOCAB:
            raise InputError(f"{args.tokenizer}: a vocabulary of {vocab} tokens does not fit "
                             "nanoGPT's uint16 tokens; use --format llmc or megatron")
        origin = {"origin": "given", "path": os.path.abspath(args.tokenizer)}
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise InputError(f"{args.output}: exists and is not a folder")
    earlier = earlier_outputs(args.output)
    if earlier and not args.overwrite:
        raise InputError(f"{args.output}: holds the outputs of an earlier run ({earlier[0]}, ...); "
                         "pass --overwrite to replace them")

    # A first pass reads every document, so that bad input (not UTF-8, not JSON, no documents)
    # is refused before anything is trained or written, and counts them for the split.
    document_count = 0
    for _ in corpus.documents():
        document_count += 1
        progress.update("reading", corpus.bytes_done)
    if document_count == 0:
        raise InputError(f"{' '.join(args.inputs)}: no documents (the corpus is empty)")
    valid_count = 0
    if args.valid_documents is not None:
        valid_count = args.valid_documents
    elif args.valid_fraction:
        valid_count = max(1, round(args.valid_fraction * document_count))
    if valid_count >= document_count:
        raise InputError(f"holding out {valid_count} validation documents of the corpus's "
                         f"{document_count} leaves none to train on")

    if args.tokenizer is None:
        progress.say(f"training a byte-level BPE of {args.vocab_size} tokens on "
                     f"{total_bytes:,} bytes")
        progress.restart()
        tokenizer = train_tokenizer(corpus, args.vocab_size, progress)
        eos_token, eos_id = TRAINED_EOS, tokenizer.token_to_id(TRAINED_EOS)
        vocab = vocabulary_size(tokenizer)
        tokenizer_bytes = tokenizer.to_str(pretty=True).encode("utf-8")
        origin = {"origin": "trained", "model": "byte-level BPE",
                  "vocab_size_requested": args.vocab_size}
    origin["sha256"] = hashlib.sha256(tokenizer_bytes).hexdigest()
    origin["tokenizers_version"] = tokenizers.__version__

    # uint16 when every id fits (Megatron-LM itself switches to int32 from 65500 tokens).
    token_dtype = "uint16" if vocab <= UINT16_VOCAB else ("uint32" if args.format == "llmc"
                                                          else "int32")

    # From here the folder changes: the earlier run's description goes first, and a failure
    # removes whatever this run wrote.
    os.makedirs(args.output, exist_ok=True)
    for name in earlier:
        if name.endswith(".partial") or name == "dataset.json":
            remove_quietly(os.path.join(args.output, name))
    writers = {split: ShardWriter(args.output, split, args.format, token_dtype, args.shard_tokens)
               for split in SPLITS}
    counts = {split: np.zeros(vocab, dtype=np.int64) for split in SPLITS}
    documents = {split: 0 for split in SPLITS}
    documents_with_eos_text = 0
    index = 0
    progress.restart()
    try:
        write_atomically(os.path.join(args.output, "tokenizer.json"), tokenizer_bytes)
        batch, batch_characters = [], 0
        for text in corpus.documents():
            batch.append(text)
            batch_characters += len(text)
            if batch_characters >= BATCH_CHARACTERS or len(batch) >= BATCH_DOCUMENTS:
                documents_with_eos_text += encode_batch(
                    tokenizer, batch, index, eos_id, valid_count, document_count, writers,
                    counts, documents, args.special_tokens)
                index += len(batch)
                batch, batch_characters = [], 0
                progress.update("encoding", corpus.bytes_done,
                                f", {sum(w.tokens for w in writers.values()):,} tokens, "
                                f"{sum(len(w.shards) for w in writers.values())} shards written")
        if batch:
            documents_with_eos_text += encode_batch(
                tokenizer, batch, index, eos_id, valid_count, document_count, writers, counts,
                documents, args.special_tokens)
            index += len(batch)
        for writer in writers.values():
            writer.finish()
    except BaseException:
        for writer in writers.values():
            writer.abandon()
        remove_quietly(os.path.join(args.output, "tokenizer.json"))
        raise

    written = {name for writer in writers.values() for name in writer.written_files()}
    for name in earlier:
        if name not in written and name not in ("dataset.json", "tokenizer.json"):
            remove_quietly(os.path.join(args.output, name))

    entropy = unigram_entropy(counts["train"])
    description = {
        "format": FORMATS[args.format],
        "token_type": token_dtype,
        "vocab_size": vocab,
        "eos_token": eos_token,
        "eos_id": eos_id,
        "eos_placement": "after every document",
        "special_tokens": args.special_tokens,
        "shard_tokens": args.shard_tokens,
        "splits": {
            split: {
                "tokens": writers[split].tokens,
                "documents": documents[split],
                "shards": [name for name, _, _ in writers[split].shards],
                "shard_tokens": [tokens for _, tokens, _ in writers[split].shards],
                "unigram_entropy_nats": unigram_entropy(counts[split]),
            } for split in SPLITS},
        "unigram_entropy_nats": entropy,
        "tokenizer": dict(file="tokenizer.json", **origin),
        "documents": {"unit": "jsonl record" if args.jsonl_field is not None else
                      "line" if args.split_lines else "file",
                      "jsonl_field": args.jsonl_field,
                      "count": index,
                      "containing_eos_text": documents_with_eos_text},
        "sources": [{"path": os.path.abspath(path), "bytes": size, "documents": count}
                    for (path, size), count in zip(sources, corpus.documents_per_source)],
    }
    write_atomically(os.path.join(args.output, "dataset.json"),
                     (json.dumps(description, indent=2) + "\n").encode("utf-8"))

    if documents_with_eos_text:
        progress.say(f"warning: {documents_with_eos_text} documents hold the text {eos_token!r}, "
                     "which the tokenizer reads as the end-of-text token")
    train, valid = writers["train"], writers["valid"]
    progress.say(f"{train.tokens:,} training tokens in {plural(len(train.shards), 'shard')}, "
                 f"{valid.tokens:,} validation tokens in {plural(len(valid.shards), 'shard')}; "
                 f"{plural(index, 'document')}; "
                 f"vocabulary {vocab}, eos {eos_id}; unigram entropy {entropy:.4f} nats; "
                 f"{FORMATS[args.format]} in {args.output}")
    if args.print_unigram_entropy:
        print(f"{entropy:.6f}")


def plural(count, noun):
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def encode_batch(tokenizer, batch, first_index, eos_id, valid_count, document_count, writers,
                 counts, documents, special_tokens=False):
    """Encodes a batch of documents (with the tokenizer's template when special_tokens),
    appends eos to each, and hands them to their splits.

    Returns how many documents produced the eos token from their own text.
    """
    import numpy as np
    encoded = [encoding.ids for encoding in
               tokenizer.encode_batch(batch, add_special_tokens=special_tokens)]
    with_eos_text = 0
    for split in SPLITS:
        members = [encoded[i] for i in range(len(batch))
                   if (split == "valid") == (valid_count > 0 and
                                             held_out(first_index + i, valid_count,
                                                      document_count))]
        if not members:
            continue
        lengths = np.array([len(ids) + 1 for ids in members], dtype=np.int64)
        tokens = np.empty(int(lengths.sum()), dtype=np.int64)
        position = 0
        for ids in members:
            tokens[position:position + len(ids)] = ids
            if eos_id in ids:
                with_eos_text += 1
            position += len(ids)
            tokens[position] = eos_id
            position += 1
        writers[split].write(tokens, lengths)
        counts[split] += np.bincount(tokens, minlength=len(counts[split]))
        documents[split] += len(members)
    return with_eos_text


def main(argv=None):
    try:
        args = parse_arguments(argv)
        import_tokenizers()
        prepare(args)
    except InputError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROGRAM}: interrupted; the shards of this run were removed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
