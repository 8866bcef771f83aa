#!/usr/bin/env python3
"""Tests scripts/prepare_data.py: text in, token shards out, in the layouts tandem reads.

The shards are read back here with struct from the layouts data/token_dataset.h documents
(llm.c's header, Megatron-LM's index, nanoGPT's bare uint16), independently of the script, and
their tokens compared with the tokenizer's own encoding of each document plus the end-of-text
token; decoding them gives back the text. Skips, naming the package, where numpy or tokenizers
is not importable (scripts/python_env.sh installs both).

  python3 tests/tokens/prepare_data_test.py [-v]
"""
import gzip
import json
import math
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "prepare_data.py")

MISSING = []
try:
    import numpy  # noqa: F401
except ImportError:
    MISSING.append("numpy")
try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
except ImportError:
    MISSING.append("tokenizers")
SKIP_REASON = (f"the Python package(s) {', '.join(MISSING)} not importable by {sys.executable} "
               "(scripts/python_env.sh installs them)")

LLMC_MAGIC = 20240520
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"

WORDS = ("the river ran north past an old mill where a miller kept three grey geese and a "
         "lantern that burned through the winter nights while snow covered the roads and "
         "travellers asked the way to the city beyond the hills café naïve façade — déjà vu "
         "über 東京 ship sailed at dawn").split()


def make_lines(count, seed):
    """`count` generated sentences: deterministic, some non-ASCII, of varied lengths."""
    generator = random.Random(seed)
    lines = []
    for _ in range(count):
        words = [generator.choice(WORDS) for _ in range(generator.randint(2, 18))]
        sentence = " ".join(words).capitalize()
        if generator.random() < 0.2:
            sentence += ", said the miller"
        lines.append(sentence + generator.choice([".", "!", "?", "..."]))
    return lines


def held_out(index, valid_count, document_count):
    """The documented validation rule: `valid_count` documents spread evenly."""
    return (index + 1) * valid_count // document_count > index * valid_count // document_count


# ---- Readers of the documented layouts, with struct --------------------------------------------

def read_llmc(test, path):
    """Checks an llm.c shard's header byte for byte; returns (tokens, version)."""
    with open(path, "rb") as stream:
        data = stream.read()
    header = struct.unpack("<256i", data[:1024])
    test.assertEqual(header[0], LLMC_MAGIC, path)
    test.assertIn(header[1], (1, 2), path)
    test.assertEqual(header[3:], (0,) * 253, f"{path}: header words 3..255 are not zero")
    width = 2 if header[1] == 1 else 4
    test.assertEqual(len(data), 1024 + header[2] * width, f"{path}: size against its count")
    tokens = list(struct.unpack(f"<{header[2]}{'H' if width == 2 else 'I'}", data[1024:]))
    return tokens, header[1]


def read_megatron(test, prefix):
    """Checks a Megatron .idx byte for byte against its .bin; returns (tokens, lengths, code)."""
    with open(prefix + ".idx", "rb") as stream:
        index = stream.read()
    with open(prefix + ".bin", "rb") as stream:
        data = stream.read()
    test.assertEqual(index[:9], MEGATRON_MAGIC, prefix)
    version, code, sequences, entries = struct.unpack("<QBQQ", index[9:34])
    test.assertEqual(version, 1)
    test.assertIn(code, (8, 4))
    test.assertEqual(entries, sequences + 1, "one document per sequence")
    test.assertEqual(len(index), 34 + 12 * sequences + 8 * entries, f"{prefix}.idx size")
    lengths = list(struct.unpack_from(f"<{sequences}i", index, 34))
    pointers = list(struct.unpack_from(f"<{sequences}q", index, 34 + 4 * sequences))
    documents = list(struct.unpack_from(f"<{entries}q", index, 34 + 12 * sequences))
    width = 2 if code == 8 else 4
    expected_pointers = [sum(lengths[:i]) * width for i in range(sequences)]
    test.assertEqual(pointers, expected_pointers, "sequences back to back")
    test.assertEqual(documents, list(range(sequences + 1)))
    test.assertEqual(len(data), sum(lengths) * width, f"{prefix}.bin size against its index")
    test.assertTrue(all(length > 0 for length in lengths))
    tokens = list(struct.unpack(f"<{len(data) // width}{'H' if width == 2 else 'i'}", data))
    return tokens, lengths, code


def read_nanogpt(test, path):
    with open(path, "rb") as stream:
        data = stream.read()
    test.assertEqual(len(data) % 2, 0)
    return list(struct.unpack(f"<{len(data) // 2}H", data))


def byte_level_bpe(texts, vocab_size, special_tokens):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


@unittest.skipIf(MISSING, SKIP_REASON)
class PrepareDataTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.mkdtemp(prefix="prepare_data_test.")
        self.addCleanup(shutil.rmtree, self.folder, ignore_errors=True)
        self.lines = make_lines(400, seed=7)
        self.corpus = self.path("corpus.txt")
        with open(self.corpus, "w", encoding="utf-8") as stream:
            stream.write("\n".join(self.lines) + "\n")

    def path(self, *names):
        return os.path.join(self.folder, *names)

    def run_script(self, *arguments, expect=0):
        result = subprocess.run([sys.executable, SCRIPT, *arguments], capture_output=True,
                                text=True, timeout=300)
        self.assertEqual(result.returncode, expect,
                         f"prepare_data.py {' '.join(arguments)}\nstderr:\n{result.stderr}")
        return result

    def expect_refused(self, *arguments, says):
        """Exit 2, one line on stderr naming the problem."""
        result = self.run_script(*arguments, expect=2)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn("error", lines[0])
        self.assertIn(says, lines[0])
        return lines[0]

    def description(self, output):
        with open(os.path.join(output, "dataset.json"), encoding="utf-8") as stream:
            return json.load(stream)

    def expected_tokens(self, tokenizer, documents, eos_id):
        """The tokenizer's own encoding of each document, eos after each (truncation off)."""
        tokenizer.no_truncation()
        tokenizer.no_padding()
        tokens = []
        for document in documents:
            tokens += tokenizer.encode(document, add_special_tokens=False).ids + [eos_id]
        return tokens

    def check_decodes(self, tokenizer, tokens, documents, eos_id):
        """The tokens are the documents, each followed by eos, and decode back to them."""
        self.assertEqual(tokens.count(eos_id), len(documents))
        self.assertEqual(tokens[-1], eos_id)
        pieces, start = [], 0
        for position, token in enumerate(tokens):
            if token == eos_id:
                pieces.append(tokens[start:position])
                start = position + 1
        self.assertEqual([tokenizer.decode(piece) for piece in pieces], documents)

    # ---- llm.c, trained tokenizer, validation split -------------------------------------------

    def test_trained_tokenizer_llmc_shards_decode_back_to_the_lines(self):
        output = self.path("out")
        result = self.run_script(self.corpus, "--split-lines", "--output", output,
                                 "--vocab-size", "512", "--shard-tokens", "1500",
                                 "--valid-fraction", "0.1", "--print-unigram-entropy")
        info = self.description(output)
        tokenizer = Tokenizer.from_file(os.path.join(output, "tokenizer.json"))
        eos_id = tokenizer.token_to_id("<|endoftext|>")
        self.assertIsNotNone(eos_id)
        self.assertEqual(info["eos_id"], eos_id)
        self.assertEqual(info["eos_token"], "<|endoftext|>")
        self.assertEqual(info["vocab_size"], tokenizer.get_vocab_size())
        self.assertLessEqual(info["vocab_size"], 512)
        self.assertGreater(info["vocab_size"], 257, "the BPE learned merges")
        self.assertEqual(info["format"], "llm.c")
        self.assertEqual(info["token_type"], "uint16")
        self.assertEqual(info["tokenizer"]["origin"], "trained")
        self.assertEqual(info["tokenizer"]["vocab_size_requested"], 512)

        # 10% of 400 documents, spread evenly: documents 9, 19, ..., 399.
        valid_indices = [i for i in range(400) if held_out(i, 40, 400)]
        self.assertEqual(valid_indices, list(range(9, 400, 10)))
        train_lines = [line for i, line in enumerate(self.lines) if i not in valid_indices]
        valid_lines = [self.lines[i] for i in valid_indices]
        for split, lines in (("train", train_lines), ("valid", valid_lines)):
            names = info["splits"][split]["shards"]
            tokens = []
            for number, name in enumerate(names):
                self.assertEqual(name, f"{split}_{number:06d}.bin")
                shard_tokens, version = read_llmc(self, os.path.join(output, name))
                self.assertEqual(version, 1)
                self.assertEqual(len(shard_tokens), info["splits"][split]["shard_tokens"][number])
                if number < len(names) - 1:
                    self.assertEqual(len(shard_tokens), 1500, "every shard but the last is full")
                tokens += shard_tokens
            self.assertEqual(tokens, self.expected_tokens(tokenizer, lines, eos_id), split)
            self.check_decodes(tokenizer, tokens, lines, eos_id)
            self.assertEqual(info["splits"][split]["tokens"], len(tokens))
            self.assertEqual(info["splits"][split]["documents"], len(lines))
            if split == "train":
                self.assertGreater(len(names), 2, "the training tokens span several shards")
                train_tokens = tokens
        self.assertEqual(sorted(os.listdir(output)),
                         sorted(["dataset.json", "tokenizer.json"] +
                                info["splits"]["train"]["shards"] +
                                info["splits"]["valid"]["shards"]))

        # The unigram entropy of the training tokens, in nats.
        counts = {}
        for token in train_tokens:
            counts[token] = counts.get(token, 0) + 1
        entropy = -sum(c / len(train_tokens) * math.log(c / len(train_tokens))
                       for c in counts.values())
        self.assertAlmostEqual(info["unigram_entropy_nats"], entropy, places=9)
        self.assertAlmostEqual(float(result.stdout.strip()), entropy, places=5)
        self.assertLess(entropy, math.log(info["vocab_size"]))
        self.assertEqual(info["sources"], [{"path": os.path.abspath(self.corpus),
                                            "bytes": os.path.getsize(self.corpus),
                                            "documents": 400}])

    def test_two_runs_write_identical_bytes(self):
        outputs = []
        for run in range(2):
            output = self.path(f"run{run}")
            self.run_script(self.corpus, "--split-lines", "--output", output, "--vocab-size",
                            "700", "--shard-tokens", "2000", "--valid-documents", "25",
                            "--format", "megatron")
            outputs.append(output)
        names = sorted(os.listdir(outputs[0]))
        self.assertEqual(names, sorted(os.listdir(outputs[1])))
        self.assertIn("tokenizer.json", names)
        for name in names:
            with open(os.path.join(outputs[0], name), "rb") as a, \
                    open(os.path.join(outputs[1], name), "rb") as b:
                self.assertEqual(a.read(), b.read(), f"{name} differs between two runs")

    # ---- Megatron and nanoGPT ---------------------------------------------------------------

    def test_megatron_index_records_each_document_and_pieces_cut_by_shards(self):
        output = self.path("megatron")
        self.run_script(self.corpus, "--split-lines", "--output", output, "--vocab-size", "600",
                        "--shard-tokens", "1000", "--format", "megatron")
        info = self.description(output)
        tokenizer = Tokenizer.from_file(os.path.join(output, "tokenizer.json"))
        eos_id = info["eos_id"]
        self.assertEqual(info["format"], "megatron")
        names = info["splits"]["train"]["shards"]
        self.assertGreater(len(names), 3)
        tokens, lengths, pieces_per_shard = [], [], []
        for name in names:
            shard_tokens, shard_lengths, code = read_megatron(self, os.path.join(output, name[:-4]))
            self.assertEqual(code, 8, "uint16")
            tokens += shard_tokens
            lengths += shard_lengths
            pieces_per_shard.append(len(shard_lengths))
        expected = self.expected_tokens(tokenizer, self.lines, eos_id)
        self.assertEqual(tokens, expected)
        self.check_decodes(tokenizer, tokens, self.lines, eos_id)
        # The sequences are the documents (eos included), each cut where a shard ends, and each
        # shard records its own pieces.
        document_ends, end = [], 0
        for line in self.lines:
            end += len(tokenizer.encode(line, add_special_tokens=False).ids) + 1
            document_ends.append(end)
        shard_ends = list(range(1000, len(expected), 1000))
        boundaries = sorted(set([0] + document_ends + shard_ends))
        self.assertEqual(lengths, [b - a for a, b in zip(boundaries, boundaries[1:])])
        self.assertGreater(len(lengths), len(self.lines), "some document was cut by a shard")
        self.assertEqual(info["splits"]["train"]["documents"], len(self.lines))

    def test_nanogpt_shards_are_bare_uint16(self):
        output = self.path("nanogpt")
        self.run_script(self.corpus, "--split-lines", "--output", output, "--vocab-size", "400",
                        "--format", "nanogpt", "--valid-documents", "3")
        info = self.description(output)
        tokenizer = Tokenizer.from_file(os.path.join(output, "tokenizer.json"))
        valid_lines = [line for i, line in enumerate(self.lines) if held_out(i, 3, 400)]
        self.assertEqual(len(valid_lines), 3)
        self.assertEqual(info["splits"]["valid"]["shards"], ["valid_000000.bin"])
        tokens = read_nanogpt(self, os.path.join(output, "valid_000000.bin"))
        self.assertEqual(tokens, self.expected_tokens(tokenizer, valid_lines, info["eos_id"]))
        self.assertEqual(len(read_nanogpt(self, os.path.join(output, "train_000000.bin"))),
                         info["splits"]["train"]["tokens"])

    # ---- A given tokenizer.json ----------------------------------------------------------------

    def test_given_tokenizer_folder_of_files_one_document_each(self):
        # A tokenizer trained on other text, whose eos is "</s>" at id 2, saved with a model's
        # truncation that the shards must not inherit.
        given = byte_level_bpe(make_lines(200, seed=99), 350, ["<unk>", "<s>", "</s>"])
        given.enable_truncation(max_length=8)
        tokenizer_path = self.path("given-tokenizer.json")
        given.save(tokenizer_path)
        folder = self.path("books")
        os.makedirs(os.path.join(folder, "part2"))
        os.makedirs(os.path.join(folder, ".hidden"))
        documents = {
            "a.txt": "\n".join(self.lines[:50]) + "\n",
            "b.txt": "Chapter 2\r\n\r\n" + "  ".join(self.lines[50:90]),
            os.path.join("part2", "c.txt.gz"): "\n\n".join(self.lines[90:200]) + "\n",
            "empty.txt": "",
            ".notes.txt": "hidden files are not read",
            os.path.join(".hidden", "d.txt"): "hidden folders are not read",
        }
        for name, text in documents.items():
            opener = gzip.open if name.endswith(".gz") else open
            with opener(os.path.join(folder, name), "wb") as stream:
                stream.write(text.encode("utf-8"))
        order = ["a.txt", "b.txt", "empty.txt", os.path.join("part2", "c.txt.gz")]  # sorted
        output = self.path("given")
        self.run_script(folder, "--tokenizer", tokenizer_path, "--output", output)
        info = self.description(output)
        with open(tokenizer_path, "rb") as a, open(os.path.join(output, "tokenizer.json"),
                                                   "rb") as b:
            self.assertEqual(a.read(), b.read(), "the given tokenizer.json is kept byte for byte")
        self.assertEqual(info["eos_token"], "</s>")
        self.assertEqual(info["eos_id"], 2)
        self.assertEqual(info["tokenizer"]["origin"], "given")
        self.assertEqual(info["tokenizer"]["path"], os.path.abspath(tokenizer_path))
        self.assertEqual(info["vocab_size"], given.get_vocab_size())
        self.assertEqual([os.path.relpath(s["path"], os.path.abspath(folder))
                          for s in info["sources"]], order)
        self.assertEqual([s["documents"] for s in info["sources"]], [1, 1, 0, 1])
        tokens, _ = read_llmc(self, os.path.join(output, "train_000000.bin"))
        texts = [documents[name] for name in order if documents[name]]
        reference = Tokenizer.from_file(tokenizer_path)
        self.assertEqual(tokens, self.expected_tokens(reference, texts, 2))
        self.assertGreater(len(tokens), 3 * 9, "not truncated to the tokenizer's max_length")
        self.check_decodes(reference, tokens, texts, 2)

    def test_special_tokens_put_the_templates_beginning_of_text_first(self):
        # A tokenizer in Llama 3's way: <|begin_of_text|> first by its template,
        # <|end_of_text|> the end-of-text token.
        given = byte_level_bpe(make_lines(200, seed=5), 350,
                               ["<|begin_of_text|>", "<|end_of_text|>"])
        begin, end = given.token_to_id("<|begin_of_text|>"), given.token_to_id("<|end_of_text|>")
        given.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", begin)])
        tokenizer_path = self.path("llama-like.json")
        given.save(tokenizer_path)
        output = self.path("special")
        self.run_script(self.corpus, "--split-lines", "--tokenizer", tokenizer_path,
                        "--special-tokens", "--output", output)
        info = self.description(output)
        self.assertTrue(info["special_tokens"])
        self.assertEqual(info["eos_token"], "<|end_of_text|>")
        tokens, _ = read_llmc(self, os.path.join(output, "train_000000.bin"))
        expected = []
        for document in self.lines:
            expected += [begin] + given.encode(document, add_special_tokens=False).ids + [end]
        self.assertEqual(tokens, expected)
        self.assertEqual(tokens[:1], [begin])
        # Without the flag, the text's own tokens, as before.
        plain = self.path("plain")
        self.run_script(self.corpus, "--split-lines", "--tokenizer", tokenizer_path,
                        "--output", plain)
        self.assertFalse(self.description(plain)["special_tokens"])
        plain_tokens, _ = read_llmc(self, os.path.join(plain, "train_000000.bin"))
        self.assertEqual(len(plain_tokens), len(tokens) - len(self.lines))
        self.assertNotIn(begin, plain_tokens)
        # A tokenizer whose template adds nothing, or none given: refused.
        plain_tokenizer = self.path("plain-tokenizer.json")
        byte_level_bpe(make_lines(50, seed=6), 300, ["</s>"]).save(plain_tokenizer)
        self.expect_refused(self.corpus, "--tokenizer", plain_tokenizer, "--special-tokens",
                            "-o", self.path("refused"), says="adds no special tokens")
        self.expect_refused(self.corpus, "--special-tokens", "-o", self.path("refused"),
                            says="--special-tokens needs --tokenizer")
        self.assertFalse(os.path.exists(self.path("refused")))

    def test_vocabulary_over_65536_writes_uint32_and_int32(self):
        # A word-level tokenizer of 70,000 words: ids above uint16's range.
        vocab = {f"w{i}": i for i in range(69_999)}
        vocab["<|endoftext|>"] = 69_999
        vocab["[UNK]"] = 70_000
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer_path = self.path("words.json")
        tokenizer.save(tokenizer_path)
        generator = random.Random(3)
        texts = [" ".join(f"w{generator.choice([5, 65_535, 65_536, 69_998, 1234])}"
                          for _ in range(generator.randint(1, 9))) for _ in range(60)]
        jsonl = self.path("records.jsonl")
        with open(jsonl, "w", encoding="utf-8") as stream:
            for text in texts:
                stream.write(json.dumps({"id": len(text), "text": text}) + "\n")
            stream.write("\n")  # a blank line is no record
        expected = self.expected_tokens(tokenizer, texts, 69_999)
        self.assertGreater(max(expected), 65_535)

        output = self.path("llmc32")
        self.run_script(jsonl, "--jsonl-field", "text", "--tokenizer", tokenizer_path,
                        "--output", output)
        info = self.description(output)
        self.assertEqual((info["vocab_size"], info["eos_id"], info["token_type"]),
                         (70_001, 69_999, "uint32"))
        tokens, version = read_llmc(self, os.path.join(output, "train_000000.bin"))
        self.assertEqual(version, 2)
        self.assertEqual(tokens, expected)

        output = self.path("megatron32")
        self.run_script(jsonl, "--jsonl-field", "text", "--tokenizer", tokenizer_path,
                        "--output", output, "--format", "megatron")
        tokens, lengths, code = read_megatron(self, os.path.join(output, "train_000000"))
        self.assertEqual(code, 4, "int32")
        self.assertEqual(tokens, expected)
        self.assertEqual(len(lengths), 60)

        self.expect_refused(jsonl, "--jsonl-field", "text", "--tokenizer", tokenizer_path,
                            "--output", self.path("nanogpt32"), "--format", "nanogpt",
                            says="does not fit nanoGPT's uint16")
        self.assertFalse(os.path.exists(self.path("nanogpt32")))

    # ---- Bad input: exit 2, one line, nothing written ----------------------------------------

    def test_bad_input_exits_2_with_one_line_and_writes_nothing(self):
        output = self.path("refused")
        empty = self.path("empty.txt")
        open(empty, "w").close()
        blank = self.path("blank.txt")
        with open(blank, "w") as stream:
            stream.write("\n   \n\t\n")
        latin1 = self.path("latin1.txt")
        with open(latin1, "wb") as stream:
            stream.write("caf\u00e9\n".encode("latin-1"))
        bad_json = self.path("bad.jsonl")
        with open(bad_json, "w") as stream:
            stream.write('{"text": "fine"}\n{"text": 3}\n')
        not_a_tokenizer = self.path("not-a-tokenizer.json")
        with open(not_a_tokenizer, "w") as stream:
            stream.write('{"hello": 1}')
        cases = [
            ((self.path("missing.txt"), "-o", output), "no such file"),
            ((empty, "-o", output), "no documents"),
            ((blank, "--split-lines", "-o", output), "no documents"),
            ((self.corpus, "-o", output, "--vocab-size", "100"), "too small"),
            ((self.corpus, "-o", output, "--vocab-size", "256"), "at least 257"),
            ((latin1, "-o", output), "not UTF-8"),
            ((bad_json, "--jsonl-field", "text", "-o", output), "bad.jsonl:2"),
            ((self.corpus, "--tokenizer", not_a_tokenizer, "-o", output), "tokenizer.json"),
            ((self.corpus, "--tokenizer", self.path("none.json"), "-o", output), "none.json"),
            ((self.corpus, "--split-lines", "--valid-documents", "400", "-o", output),
             "none to train on"),
            ((self.corpus, "--valid-fraction", "1.5", "-o", output), "--valid-fraction"),
            ((self.corpus, "--shard-tokens", "0", "-o", output), "--shard-tokens"),
            ((self.corpus, self.corpus, "-o", output), "named twice"),
            ((self.corpus, "--format", "bin", "-o", output), "--format"),
            ((self.corpus,), "--output"),
        ]
        for arguments, says in cases:
            with self.subTest(arguments=arguments):
                self.expect_refused(*arguments, says=says)
                self.assertFalse(os.path.exists(output), "a refused run made its output folder")

        # An earlier run's outputs are not replaced without --overwrite.
        self.run_script(self.corpus, "-o", output, "--vocab-size", "300")
        before = sorted(os.listdir(output))
        self.expect_refused(self.corpus, "-o", output, says="--overwrite")
        self.assertEqual(sorted(os.listdir(output)), before)

    def test_an_interrupted_run_removes_what_it_wrote(self):
        # Interrupted (SIGINT) once its first shards are in place: it removes them, its
        # temporary files and tokenizer.json, and writes no dataset.json.
        big = self.path("big.txt")
        with open(big, "w", encoding="utf-8") as stream:
            for seed in range(40):
                stream.write("\n".join(make_lines(2000, seed=seed)) + "\n")
        tokenizer_path = self.path("given.json")
        byte_level_bpe(self.lines, 400, ["<|endoftext|>"]).save(tokenizer_path)
        output = self.path("interrupted")
        process = subprocess.Popen(
            [sys.executable, SCRIPT, big, "--split-lines", "--tokenizer", tokenizer_path,
             "--shard-tokens", "2000", "-o", output],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            if os.path.isdir(output) and any(n.endswith(".bin") for n in os.listdir(output)):
                break
            time.sleep(0.005)
        if process.poll() is not None:
            process.communicate()
            self.skipTest("the run finished before it could be interrupted")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
        self.assertEqual(process.returncode, 130, stderr)
        self.assertIn("interrupted", stderr)
        self.assertEqual(os.listdir(output), [])

    def test_overwrite_removes_the_earlier_runs_extra_shards(self):
        output = self.path("again")
        self.run_script(self.corpus, "--split-lines", "-o", output, "--vocab-size", "300",
                        "--shard-tokens", "1000", "--format", "megatron")
        self.assertIn("train_000005.idx", os.listdir(output))
        self.run_script(self.corpus, "--split-lines", "-o", output, "--vocab-size", "300",
                        "--overwrite")
        self.assertEqual(sorted(os.listdir(output)),
                         ["dataset.json", "tokenizer.json", "train_000000.bin"])


if __name__ == "__main__":
    unittest.main()
