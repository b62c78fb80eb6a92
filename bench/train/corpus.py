#!/usr/bin/env python3
"""A large real-text corpus from Debian 12 (bookworm) packages, for loss-curve comparisons.

Comparing shardtrain's loss curve with PyTorch's over thousands of steps needs real text that
does not repeat: this script gathers the English prose and technical writing that Debian ships
in its documentation and dictionary packages (about 222 million characters, ~58M Llama-3 tokens).

  python3 bench/train/corpus.py build --out DIR [--packages p1,p2,...] [--max-mb N]
  python3 bench/train/corpus.py stats --out DIR

build downloads each package with `apt-get download` into DIR/debs (a .deb already there is
reused), unpacks it with `dpkg-deb -x` into a scratch folder, and writes
  DIR/train.jsonl     {"text": ...}, one document a line: one source file, or for dictionaries
                      and fortune files a ~4 KiB chunk of whole entries. Documents under 200
                      characters are dropped; line ends are normalised and NUL bytes removed.
                      Sorted by package and path, then shuffled with random.Random(1234) so that
                      packages interleave.
  DIR/finetune.jsonl  {"prompt": ..., "response": ...} for a supervised fine-tuning comparison:
                      a section heading and its document's title ask, the section's first
                      paragraphs (at most ~1,500 characters) answer. Deterministic, <= 60,000.
  DIR/MANIFEST.json   each package's version, .deb sha256, documents and characters; totals.
--max-mb N keeps the first N million characters of the shuffled documents (a quick corpus).
stats prints documents and characters per package from DIR/MANIFEST.json.

Sources, and why: what each package ships as text, never its HTML or PDF renderings.
  linux-doc-6.12     the kernel's Documentation/ reStructuredText (English; translations/ and
                     the html/_sources copy of the same files are left out). Newer and larger
                     than linux-doc-6.1, which would only duplicate it.
  Sphinx documentation packages (python3.11-doc, llvm-15-doc, clang-15-doc, cmake-doc,
                     python-sklearn-doc, dpdk-doc, the OpenStack *-doc manuals, ...): the
                     reStructuredText each HTML page was built from (html/_sources/*.txt).
  python-sqlalchemy-doc  its rst sources; perl-doc  the core pod manuals;
  vim-runtime        Vim's help files; git-doc  git's asciidoc manuals; nodejs-doc  API markdown;
  r-doc-info, exim4-doc-info  GNU info manuals; manpages, manpages-dev  Linux man pages
                     (troff, reduced to text); ada-reference-manual-2012  the annotated Ada
                     reference manual as plain text (the plain manual is a subset of it);
  dict-gcide, dict-wn, dict-foldoc, dict-jargon, dict-devil, dict-vera  dictd dictionaries:
                     Webster 1913/GCIDE, WordNet, computing, jargon, Bierce, acronyms;
  fortunes           quotations and short prose.
Left out: debian-reference-en, debian-handbook, python-django-doc, python-scipy-doc,
python-statsmodels-doc, zsh-doc, bash-doc (HTML/PDF only); bible-kjv-text (a compressed
private format); doc-rfc, gcc/make/gawk manuals (non-free, not in main); dict-freedict-*
(bilingual word lists); the devicetree .yaml in linux-doc (schemas, not prose).
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import zlib

SPHINX = [(r'/_sources/(?!translations/).*\.txt$', 'text')]   # each page's rst source
DICT = [(r'/dictd/[^/]+\.dict\.dz$', 'dict')]
MAN = [(r'/man/man\d/[^/]+\.gz$', 'man')]
INFO = [(r'/info/[^/]+\.info(-\d+)?\.gz$', 'info')]
SOURCES = {
    'linux-doc-6.12': [(r'/Documentation/(?!translations/).*\.(rst|txt)(\.gz)?$', 'text')],
    'perl-doc': [(r'/pod/[^/]+\.pod$', 'text')],
    'python-sqlalchemy-doc': [(r'/rst/.*\.rst$', 'text')],
    'vim-runtime': [(r'/vim\d+/doc/[^/]+\.txt$', 'text')],
    'git-doc': [(r'/git-doc/.*\.txt$', 'text')],
    'nodejs-doc': [(r'/api/[^/]+\.md(\.gz)?$', 'text')],
    'ada-reference-manual-2012': [(r'/aarm2012\.txt/aa-(?!IDX|TOC|Ttl|Lib)[^/]+\.TXT$', 'text')],
    'fortunes': [(r'/games/fortunes/[a-z-]+$', 'fortune')],
    'r-doc-info': INFO, 'exim4-doc-info': INFO, 'manpages': MAN, 'manpages-dev': MAN,
    **{p: DICT for p in ('dict-gcide', 'dict-wn', 'dict-foldoc', 'dict-jargon', 'dict-devil',
                         'dict-vera')},
    **{p: SPHINX for p in (
        'python3.11-doc', 'llvm-15-doc', 'clang-15-doc', 'cmake-doc', 'python-sklearn-doc',
        'dpdk-doc', 'python-astropy-doc', 'python-pandas-doc', 'python-sympy-doc', 'twisted-doc',
        'sphinx-doc', 'debian-policy', 'developers-reference', 'python-flask-doc',
        'python-setuptools-doc', 'python-skimage-doc', 'nova-doc', 'glance-doc', 'neutron-doc',
        'cinder-doc', 'keystone-doc', 'heat-doc', 'ironic-doc', 'manila-doc', 'octavia-doc',
        'swift-doc', 'python-pytest-doc', 'python-celery-doc', 'python-dask-doc',
        'python-distributed-doc', 'python-ipython-doc', 'python-xarray-doc',
        'python-cryptography-doc', 'python-hypothesis-doc', 'mypy-doc', 'ganeti-doc',
        'python-astroquery-doc', 'python-ase-doc')},
}
MIN_DOC, CHUNK, MAX_RESPONSE, MAX_EXAMPLES, SEED = 200, 4096, 1500, 60000, 1234


def sh(*cmd, cwd=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f'corpus.py: `{" ".join(cmd)}` failed ({r.returncode}): {r.stderr.strip()}')
    return r.stdout


def fetch(pkg, debs):
    """The package's .deb in debs (downloaded unless one is there), its version and sha256."""
    found = sorted(glob.glob(os.path.join(debs, f'{pkg}_*.deb')))
    if not found:
        sh('apt-get', 'download', '-q', pkg, cwd=debs)
        found = sorted(glob.glob(os.path.join(debs, f'{pkg}_*.deb')))
        if not found:
            sys.exit(f'corpus.py: `apt-get download {pkg}` left no {pkg}_*.deb in {debs}')
    deb = found[-1]
    with open(deb, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return deb, sh('dpkg-deb', '-f', deb, 'Version').strip(), digest


def clean(text):
    return text.replace('\r\n', '\n').replace('\r', '\n').replace('\x00', '')


def read_text(path):
    with open(path, 'rb') as f:
        data = f.read()
    if path.endswith(('.gz', '.dz')):
        data = gzip.decompress(data)   # dictzip is gzip with an extra header field
    return clean(data.decode('utf-8', errors='replace'))


def chunks(entries):
    """Whole entries joined into pieces of about CHUNK characters."""
    piece = []
    for e in entries:
        piece.append(e.strip('\n'))
        if sum(len(p) for p in piece) >= CHUNK:
            yield '\n\n'.join(piece)
            piece = []
    if piece:
        yield '\n\n'.join(piece)


B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'


def dict_entries(path):
    """A dictd database's entries in file order, through its .index (word, offset, length)."""
    data = gzip.decompress(open(path, 'rb').read())
    spans = set()
    with open(path[:-len('.dict.dz')] + '.index', encoding='utf-8', errors='replace') as f:
        for line in f:
            word, *rest = line.rstrip('\n').split('\t')
            if len(rest) >= 2 and not word.startswith('00-database') and not word.startswith('00database'):
                off, n = (sum(B64.index(c) * 64 ** i for i, c in enumerate(reversed(x))) for x in rest[:2])
                spans.add((off, n))
    return [clean(data[o:o + n].decode('utf-8', errors='replace')) for o, n in sorted(spans)]


ROFF = {r'\-': '-', r'\(aq': "'", r'\(dq': '"', r'\(em': '\u2014', r'\(en': '\u2013', r'\(bu': '\u2022',
        r'\(lq': '"', r'\(rq': '"', r'\(oq': "'", r'\(cq': "'", r'\(co': '\u00a9', r'\(rs': '\\',
        r'\e': '\\', r'\&': '', r'\~': ' ', '\\ ': ' ', r'\|': '', r'\^': '', r'\c': ''}


def deroff(text):
    """Man-page troff reduced to its text: requests dropped, font and character escapes resolved."""
    out = []
    for line in text.split('\n'):
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        m = re.match(r"[.']\s*(\w+)\s*(.*)", line)
        if not m:
            out.append(line if not line.startswith(('.', "'")) else '')
            continue
        req, arg = m.groups()
        args = [a or b for a, b in re.findall(r'"([^"]*)"|(\S+)', arg)]
        if req in ('SH', 'SS'):
            out += ['', ' '.join(args)]
        elif req in ('B', 'I', 'SM', 'SB'):
            out.append(' '.join(args))
        elif re.fullmatch(r'[BIR][BIR]', req):
            out.append(''.join(args))
        elif req in ('PP', 'LP', 'P', 'TP', 'IP', 'sp', 'HP'):
            out += [''] + ([args[0]] if req == 'IP' and args else [])
    text = re.sub(r'\\f(\[[^\]]*\]|\(..|.)', '', '\n'.join(out))
    for k, v in ROFF.items():
        text = text.replace(k, v)
    text = re.sub(r'\\(\(..|\*\(..|\*.|\[[^\]]*\])', '', text)
    return re.sub(r'\n{3,}', '\n\n', text).strip() + '\n'


def deinfo(text):
    """An info file's nodes without the node headers, tag tables and indirect tables."""
    nodes = [n.split('\n', 2) for n in text.split('\x1f')]
    keep = [n[2] if len(n) == 3 and n[1].startswith('File:') else '' for n in nodes]
    return '\n'.join(k for k in keep if k.strip())


def documents(pkg, root):
    """(path, text) for each document the package gives."""
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            rel = '/' + os.path.relpath(path, root)
            kinds = [k for rx, k in SOURCES[pkg] if re.search(rx, rel)]
            if not kinds or os.path.islink(path):
                continue
            if kinds[0] == 'dict':
                yield from ((f'{rel}#{i}', t) for i, t in enumerate(chunks(dict_entries(path))))
            elif kinds[0] == 'fortune':
                entries = re.split(r'^%\n', read_text(path), flags=re.M)
                yield from ((f'{rel}#{i}', t) for i, t in enumerate(chunks(entries)))
            else:
                text = read_text(path)
                yield rel, {'man': deroff, 'info': deinfo}.get(kinds[0], lambda t: t)(text)


def sections(text, path):
    """(heading, body lines) of a reStructuredText, markdown or pod document."""
    lines, heads = text.split('\n'), []
    marked = (r'#{1,6} +(.+)' if path.endswith(('.md', '.md.gz')) else r'=head\d\s+(.+)'
              if path.endswith('.pod') else r'={2,5} +(\w.*?)( =+)?' if '/git-doc/' in path else None)
    for i, line in enumerate(lines):
        nxt, prev = (lines[i + 1] if i + 1 < len(lines) else ''), (lines[i - 1] if i else '')
        m = marked and re.fullmatch(marked, line)
        if m:
            heads.append((i, i + 1, m.group(1)))
        elif (re.match(r'\w|[\'"`:]', line.strip()) and (not line[0].isspace() or prev == nxt)
              and len(line.strip()) <= len(nxt.rstrip()) <= len(line.strip()) + (12 if marked else 999)
              and re.fullmatch(r'([=\-~^"\'`#*+])\1{2,}', nxt.rstrip())):   # rst/asciidoc underline
            # (asciidoc's underlines match their titles; its longer dashed lines delimit code)
            heads.append((i - (prev == nxt), i + 2, line))
    for j, (_, start, head) in enumerate(heads):
        end = heads[j + 1][0] if j + 1 < len(heads) else len(lines)
        yield head, lines[start:end]


def inline(s):
    s = re.sub(r':\w+:`([^`<]*?)\s*(<[^>]*>)?`', r'\1', s)   # :ref:`text <target>`
    s = re.sub(r'[BCIL]<([^<>]*)>', r'\1', s)                 # pod B<...> and friends
    return re.sub(r'[`*]|\\', '', s).strip(' #.:')


SKIP_HEADS = {'name', 'contents', 'table of contents', 'see also', 'author', 'authors', 'copyright',
              'license', 'index', 'references', 'footnotes', 'synopsis'}
TEMPLATES = ['Explain {h} (from {t}).', 'What does the {t} documentation say about {h}?',
             'Describe {h}, as covered in {t}.']


def examples(pkg, path, text):
    """Prompt/response pairs from a document's sections."""
    if (not re.search(r'(_sources/.*\.txt|\.rst(\.gz)?|\.md(\.gz)?|\.pod|/git-doc/.*\.txt)$', path)
            or path.endswith('/perltoc.pod')):   # a table of contents: headings without prose
        return
    title = re.sub(r'\..*', '', os.path.basename(path)) if path.endswith('.pod') else None
    for head, body in sections(text, path):
        head = inline(head)
        title = title or head
        if head.lower() in SKIP_HEADS or len(head) > 120 or not re.search(r'[A-Za-z]{3}', head):
            continue
        paras = [p.strip('\n') for p in re.split(r'\n\s*\n', '\n'.join(body)) if p.strip()]
        paras = [p for p in paras if not re.match(r'\s*(\.\.|=\w|[:|+[])', p) and re.search(r'\w', p)]
        if not paras or not re.match(r'[A-Za-z"\'(`*]', paras[0]):
            continue   # the section opens with code, a table or a directive
        response = paras[0]
        for p in paras[1:3]:
            if len(response) + 2 + len(p) > MAX_RESPONSE:
                break
            response += '\n\n' + p
        if len(response) > MAX_RESPONSE:
            cut = response.rfind('. ', 0, MAX_RESPONSE)
            response = response[:cut + 1] if cut > MAX_RESPONSE // 3 else response[:MAX_RESPONSE]
        if len(response) < 100:
            continue
        t = title if head != title else f'{pkg}'
        tmpl = TEMPLATES[zlib.crc32(f'{path}\0{head}'.encode()) % len(TEMPLATES)]
        yield {'prompt': tmpl.format(h=head, t=t), 'response': response}


def build(args):
    out = os.path.abspath(args.out)
    debs = os.path.join(out, 'debs')
    os.makedirs(debs, exist_ok=True)
    pkgs = args.packages.split(',') if args.packages else sorted(SOURCES)
    unknown = [p for p in pkgs if p not in SOURCES]
    if unknown:
        sys.exit(f'corpus.py: --packages names {", ".join(unknown)}, which this script has no '
                 f'extraction rules for; known packages: {", ".join(sorted(SOURCES))}')
    docs, manifest = [], {}
    for pkg in sorted(pkgs):
        deb, version, digest = fetch(pkg, debs)
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            sh('dpkg-deb', '-x', deb, tmp)
            got = [(pkg, p, t) for p, t in documents(pkg, tmp) if len(t) >= MIN_DOC]
        if not got:
            sys.exit(f'corpus.py: {os.path.basename(deb)} gave no documents of {MIN_DOC}+ characters; '
                     'its layout may have changed: check the rules for it in SOURCES')
        docs += got
        manifest[pkg] = {'version': version, 'deb': os.path.basename(deb), 'sha256': digest}
        print(f'{pkg} {version}: {len(got)} documents, {sum(len(t) for _, _, t in got):,} characters',
              file=sys.stderr)
    docs.sort(key=lambda d: d[:2])
    random.Random(SEED).shuffle(docs)
    if args.max_mb:
        budget, kept = args.max_mb * 1e6, []
        for d in docs:
            if budget < len(d[2]):
                break
            budget -= len(d[2])
            kept.append(d)
        docs = kept
    for m in manifest.values():
        m.update(documents=0, characters=0, finetune_examples=0)
    with open(os.path.join(out, 'train.jsonl'), 'w', encoding='utf-8') as f:
        for pkg, _, text in docs:
            f.write(json.dumps({'text': text}, ensure_ascii=False) + '\n')
            manifest[pkg]['documents'] += 1
            manifest[pkg]['characters'] += len(text)
    seen, pairs = set(), []
    for pkg, path, text in sorted(docs, key=lambda d: d[:2]):
        for ex in examples(pkg, path, text):
            if ex['response'] not in seen:
                seen.add(ex['response'])
                pairs.append((pkg, ex))
    random.Random(SEED).shuffle(pairs)
    pairs = pairs[:MAX_EXAMPLES]
    with open(os.path.join(out, 'finetune.jsonl'), 'w', encoding='utf-8') as f:
        for pkg, ex in pairs:
            f.write(json.dumps(ex, ensure_ascii=False) + '\n')
            manifest[pkg]['finetune_examples'] += 1
    total = {k: sum(m[k] for m in manifest.values()) for k in ('documents', 'characters', 'finetune_examples')}
    with open(os.path.join(out, 'MANIFEST.json'), 'w') as f:
        json.dump({'distribution': 'Debian 12 (bookworm)', 'seed': SEED, 'max_mb': args.max_mb,
                   'packages': manifest, 'total': total}, f, indent=1)
    stats(args)


def stats(args):
    path = os.path.join(args.out, 'MANIFEST.json')
    if not os.path.exists(path):
        sys.exit(f'corpus.py: no {path}; run `corpus.py build --out {args.out}` first')
    with open(path) as f:
        man = json.load(f)
    rows = sorted(man['packages'].items(), key=lambda kv: -kv[1]['characters'])
    print(f'{"package":28} {"version":32} {"documents":>9} {"characters":>13} {"finetune":>8}')
    for name, m in rows + [('total', dict(man['total'], version=''))]:
        print(f'{name:28} {m["version"]:32} {m["documents"]:9,} {m["characters"]:13,} '
              f'{m["finetune_examples"]:8,}')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    b = sub.add_parser('build', help='download, extract and write the corpus')
    b.add_argument('--out', required=True, help='output folder (debs/ is kept there)')
    b.add_argument('--packages', help='comma-separated subset of the known packages')
    b.add_argument('--max-mb', type=float, help='keep at most this many million characters')
    s = sub.add_parser('stats', help='documents and characters per package')
    s.add_argument('--out', required=True)
    args = ap.parse_args()
    build(args) if args.cmd == 'build' else stats(args)


if __name__ == '__main__':
    main()
