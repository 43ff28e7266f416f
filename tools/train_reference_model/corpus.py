"""Collects the training text from Debian packages into one copyable folder.

Sources (all installed from Debian main):
  linux-doc-6.1         /usr/share/doc/linux-doc-6.1/Documentation/**/*.rst[.gz], *.txt[.gz]
                        (translations/ left out: not English). License per file from its
                        SPDX-License-Identifier line; files without one are covered by the
                        kernel's GPL-2.0 (Documentation is part of the kernel source).
  debian-reference-en   /usr/share/debian-reference/debian-reference.en.txt.gz, split into
                        its chapters (one "file" each). GPL-2.0-or-later.
  fortunes, fortunes-min  the fortune files listed in FORTUNE_FILES, one document per
                        fortune. BSD-3-Clause (fortune-mod's license, debian/copyright).

The held-out split is chosen per file: within each source, files are ordered by the
SHA-256 of "heldout:" + their path, and the first ceil(HELDOUT_FRACTION * n) are held out.
The folder holds train.jsonl and heldout.jsonl (one {"file", "text"} document per line)
and manifest.json (every file with package, license, split, bytes and SHA-256).
"""

import gzip
import hashlib
import json
import math
import os
import re
import subprocess

LINUX_DOC_ROOT = "/usr/share/doc/linux-doc-6.1/Documentation"
DEBIAN_REFERENCE = "/usr/share/debian-reference/debian-reference.en.txt.gz"
FORTUNE_DIR = "/usr/share/games/fortunes"
# English prose fortunes. Left out: art/ascii-art (pictures), translate-me (not English),
# songs-poems/startrek/pratchett (quoted verse and scripts), and the joke files whose
# humour is about groups of people (ethnic, men-women, politics).
FORTUNE_FILES = [
    "computers", "debian", "definitions", "education", "fortunes", "goedel", "humorists",
    "kids", "law", "linux", "linuxcookie", "literature", "magic", "medicine",
    "miscellaneous", "paradoxum", "people", "perl", "platitudes", "riddles", "science",
    "tao", "wisdom", "work"
]
HELDOUT_FRACTION = 0.03
MAX_BYTES = 40 * 1000 * 1000

_SPDX = re.compile(r"SPDX-License-Identifier:\s*(.+?)\s*(?:\*/|-->)?\s*$")


def _package_version(package):
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _read_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")


def _linux_doc_files():
    out = []
    for dirpath, dirnames, filenames in os.walk(LINUX_DOC_ROOT):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, LINUX_DOC_ROOT)
        if rel_dir == "translations" or rel_dir.startswith("translations" + os.sep):
            continue
        for name in sorted(filenames):
            if re.search(r"\.(rst|txt)(\.gz)?$", name):
                out.append(os.path.join(dirpath, name))
    return out


def _linux_doc_license(text):
    for line in text.splitlines()[:5]:
        m = _SPDX.search(line)
        if m:
            return m.group(1)
    return "GPL-2.0-only (kernel source license; no SPDX line in the file)"


def _debian_reference_chapters():
    text = _read_text(DEBIAN_REFERENCE)
    # Headings use no-break spaces ("Chapter\xa01.\xa0GNU/Linux tutorials").
    parts = re.split(r"(?m)^(?=Chapter\s\d+\.\s|Appendix\s[A-Z]\.\s)", text)
    out = []
    for i, part in enumerate(parts):
        head = part.split("\n", 1)[0]
        m = re.match(r"(Chapter|Appendix)\s(\w+)\.", head)
        label = f"{m.group(1)}-{m.group(2)}".lower() if m else "front-matter"
        out.append((f"{DEBIAN_REFERENCE}#{i:02d}-{label}", [part.strip("\n") + "\n"]))
    return out


def _fortunes(name):
    text = _read_text(os.path.join(FORTUNE_DIR, name))
    docs = [d.strip("\n") + "\n" for d in re.split(r"(?m)^%\n", text)]
    return [d for d in docs if d.strip()]


def _heldout_set(paths):
    ranked = sorted(paths, key=lambda p: hashlib.sha256(("heldout:" + p).encode()).hexdigest())
    return set(ranked[:math.ceil(HELDOUT_FRACTION * len(ranked))])


def prepare(out_dir, log=print):
    """Writes train.jsonl, heldout.jsonl and manifest.json into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    # (package, license or None, [(file, [documents])])
    sources = []
    linux = []
    for path in _linux_doc_files():
        linux.append((path, [_read_text(path)]))
    sources.append(("linux-doc-6.1", None, linux))
    sources.append(("debian-reference-en", "GPL-2.0-or-later", _debian_reference_chapters()))
    fortunes = []
    for name in FORTUNE_FILES:
        path = os.path.join(FORTUNE_DIR, name)
        if os.path.exists(path):
            fortunes.append((path, _fortunes(name)))
    sources.append(("fortunes", "BSD-3-Clause (fortune-mod, see /usr/share/doc/fortunes/"
                    "copyright)", fortunes))

    manifest = {"heldout_rule": f"per source, the first ceil({HELDOUT_FRACTION} * n) files "
                                "by sha256('heldout:' + path)",
                "packages": {}, "files": []}
    totals = {"train": 0, "heldout": 0}
    with open(os.path.join(out_dir, "train.jsonl"), "w", encoding="utf-8") as train_f, \
         open(os.path.join(out_dir, "heldout.jsonl"), "w", encoding="utf-8") as held_f:
        for package, license_, files in sources:
            pkg = package if package != "fortunes" else "fortunes, fortunes-min"
            manifest["packages"][pkg] = {
                p: _package_version(p) for p in pkg.split(", ")}
            held = _heldout_set([p for p, _ in files])
            for path, docs in files:
                docs = [d for d in docs if d.strip()]
                if not docs:
                    continue
                split = "heldout" if path in held else "train"
                body = "".join(docs).encode("utf-8")
                lic = license_ or _linux_doc_license(docs[0])
                manifest["files"].append({
                    "file": path, "package": pkg, "license": lic, "split": split,
                    "documents": len(docs), "bytes": len(body),
                    "sha256": hashlib.sha256(body).hexdigest()})
                out = held_f if split == "heldout" else train_f
                for d in docs:
                    out.write(json.dumps({"file": path, "text": d}, ensure_ascii=False) + "\n")
                totals[split] += len(body)
    manifest["bytes"] = totals
    manifest["licenses"] = sorted({f["license"] for f in manifest["files"]})
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
    size = sum(os.path.getsize(os.path.join(out_dir, n))
               for n in ("train.jsonl", "heldout.jsonl", "manifest.json"))
    log(f"data: {len(manifest['files'])} files, train {totals['train']} bytes, held out "
        f"{totals['heldout']} bytes, folder {size} bytes")
    if size > MAX_BYTES:
        raise RuntimeError(f"prepared data is {size} bytes, more than the {MAX_BYTES} allowed")
    return manifest


def read_documents(data_dir, split):
    """The documents of one split ("train" or "heldout"), in file order."""
    path = os.path.join(data_dir, f"{split}.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: run the prepare-data step first")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]
