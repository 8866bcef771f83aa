#!/usr/bin/env python3
"""Writes the six novels in Debian's r-cran-janeaustenr as UTF-8 text files, without R.

  janeausten_text.py ROOT OUT_DIR    (ROOT: where `dpkg-deb -x r-cran-janeaustenr_*.deb ROOT` put it)

The package's data is an R lazy-load database: data/Rdata.rdx is a gzip'd serialized index
(names -> [offset, length] in data/Rdata.rdb), each .rdb entry a big-endian uncompressed size
and a zlib stream of one serialized object, here a character vector of the novel's lines.
Decodes R's XDR serialization for the few types these objects use.
"""
import gzip, os, struct, sys, zlib


class Unserializer:
    def __init__(self, data):
        assert data[:2] == b"X\n", "not R's XDR serialization"
        self.data, self.pos, self.symbols = data, 2, []
        version = self.int(); self.int(); self.int()
        if version == 3:
            self.pos += 4 + self.int()  # the native encoding's name

    def int(self):
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def read(self):
        flags = self.int()
        kind, has_attributes, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == 254:                      # NILVALUE
            return None
        if kind == 1:                        # SYMSXP: its name, kept for later references
            self.symbols.append(self.read())
            return self.symbols[-1]
        if kind == 255:                      # REFSXP: a symbol seen before
            return self.symbols[(flags >> 8 or self.int()) - 1]
        if kind == 2:                        # LISTSXP: [(tag, value), ...]
            if has_attributes:
                self.read()
            tag = self.read() if has_tag else None
            value = self.read()
            return [(tag, value)] + (self.read() or [])
        if kind == 9:                        # CHARSXP
            length = self.int()
            if length == -1:
                return None
            text = self.data[self.pos:self.pos + length].decode("utf-8")
            self.pos += length
            return text
        length = self.int()
        if kind in (16, 19):                 # STRSXP, VECSXP
            value = [self.read() for _ in range(length)]
        elif kind in (10, 13):               # LGLSXP, INTSXP
            value = list(struct.unpack_from(f">{length}i", self.data, self.pos))
            self.pos += 4 * length
        else:
            raise ValueError(f"R type {kind} is not handled")
        if has_attributes:
            return value, dict(self.read())
        return value


def main(root, out):
    base = os.path.join(root, "usr/lib/R/site-library/janeaustenr/data/Rdata")
    index, _ = Unserializer(gzip.open(base + ".rdx").read()).read()
    entries, attributes = index[0]
    with open(base + ".rdb", "rb") as stream:
        database = stream.read()
    os.makedirs(out, exist_ok=True)
    for name, (offset, length) in zip(attributes["names"], entries):
        blob = database[offset:offset + length]
        data = zlib.decompress(blob[4:])
        assert len(data) == struct.unpack(">I", blob[:4])[0]
        lines = Unserializer(data).read()
        with open(os.path.join(out, name + ".txt"), "w", encoding="utf-8") as stream:
            stream.write("\n".join(line or "" for line in lines) + "\n")
        print(f"{name}.txt: {len(lines)} lines")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
