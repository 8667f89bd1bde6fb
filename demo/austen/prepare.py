"""Prepare the demo model's corpus and tokenizer (runs here, on a machine with Debian's
package archive and PyPI; no GPU):

    python3 demo/austen/prepare.py OUT

1. The corpus: Jane Austen's six novels (Emma, Mansfield Park, Northanger Abbey,
   Persuasion, Pride and Prejudice, Sense and Sensibility), public domain, as Debian's
   r-cran-janeaustenr package ships them (MIT-licensed package by Julia Silge, texts from
   Project Gutenberg). The package's lazy-load database (data/Rdata.rdx, an index, and
   data/Rdata.rdb, zlib-compressed serialized R vectors) is read with the `rdata` PyPI
   package. Lines are joined into paragraphs; each novel's last 800 lines are held out for
   perplexity. Writes OUT/train.txt and OUT/heldout.txt, one paragraph a line.
2. The tokenizer: byte-level BPE (GPT-2's pre-tokenization, which gollm's tokenizer reads)
   with a 4,096-token vocabulary trained by Hugging Face `tokenizers` on train.txt, and
   <|endoftext|> (id 0) as the end token. Writes OUT/tokenizer.json.
"""
import glob
import gzip
import os
import subprocess
import sys
import tempfile
import zlib

import rdata
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HELDOUT_LINES = 800
VOCAB = 4096


def novels(tmp):
    """The six novels as {name: [line, ...]} from the Debian package."""
    subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL)
    deb = glob.glob(os.path.join(tmp, "r-cran-janeaustenr_*.deb"))[0]
    subprocess.run(["dpkg", "-x", deb, os.path.join(tmp, "pkg")], check=True)
    data = glob.glob(os.path.join(tmp, "pkg", "usr", "lib", "R", "site-library", "janeaustenr", "data"))[0]
    index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress(open(os.path.join(data, "Rdata.rdx"), "rb").read())))
    rdb = open(os.path.join(data, "Rdata.rdb"), "rb").read()
    out = {}
    for name, (off, n) in index["variables"].items():
        blob = rdb[int(off):int(off) + int(n)]
        lines = rdata.conversion.convert(rdata.parser.parse_data(zlib.decompress(blob[4:])))
        out[str(name)] = [str(l) for l in lines]
    return out


def paragraphs(lines):
    """Blank-line separated paragraphs, each one line; chapter headings stay paragraphs."""
    out, cur = [], []
    for l in lines:
        l = l.strip()
        if l:
            cur.append(l)
        elif cur:
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        books = novels(tmp)
    train, held = [], []
    for name in sorted(books):
        lines = books[name]
        train += paragraphs(lines[:-HELDOUT_LINES])
        held += paragraphs(lines[-HELDOUT_LINES:])
    for fname, ps in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(out, fname), "w") as f:
            f.write("\n".join(ps) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([os.path.join(out, "train.txt")], trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    ntrain = sum(len(tok.encode(p).ids) for p in train)
    nheld = sum(len(tok.encode(p).ids) for p in held)
    print(f"{len(train)} training paragraphs ({ntrain} tokens), {len(held)} held out ({nheld} tokens); "
          f"vocabulary {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
