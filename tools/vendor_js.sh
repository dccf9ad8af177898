#!/usr/bin/env bash
# Vendor the JavaScript the static site needs, so that it makes no request outside itself.
# Re-run to refresh book/_static/vendor/ (versions are pinned below; needs npm and network).
#   bash tools/vendor_js.sh
# - @jupyter-widgets/html-manager (embed-amd.js + the font files it references) and require.js:
#   loaded by myst-nb on pages that carry ipywidgets state (nb_ipywidgets_js in _config.yml).
# - MathJax 3 (tex-chtml component, CHTML woff-v2 fonts, TeX extensions, a11y + ui modules it may
#   load on demand): mathjax_path in _config.yml.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
HTML_MANAGER=1.0.15
REQUIREJS=2.3.8
MATHJAX=3.2.2

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/book/_static/vendor"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
npm pack --silent "@jupyter-widgets/html-manager@$HTML_MANAGER" "requirejs@$REQUIREJS" \
  "mathjax@$MATHJAX" >/dev/null
for f in *.tgz; do mkdir -p "x/${f%.tgz}" && tar xzf "$f" -C "x/${f%.tgz}"; done

rm -rf "$dest" && mkdir -p "$dest/html-manager" "$dest/requirejs" "$dest/mathjax"

hm="x/jupyter-widgets-html-manager-$HTML_MANAGER/package"
cp "$hm/dist/embed-amd.js" "$hm/dist/embed.js.LICENSE.txt" "$hm/package.json" "$dest/html-manager/"
cp "$hm"/dist/*.{woff,woff2,ttf,eot,svg} "$dest/html-manager/"
cat > "$dest/html-manager/LICENSE" <<'LIC'
BSD 3-Clause License (@jupyter-widgets/html-manager, part of ipywidgets)

Copyright (c) 2015 Project Jupyter Contributors
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this
   list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice,
   this list of conditions and the following disclaimer in the documentation
   and/or other materials provided with the distribution.

3. Neither the name of the copyright holder nor the names of its
   contributors may be used to endorse or promote products derived from
   this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
LIC

rj="x/requirejs-$REQUIREJS/package"
cp "$rj/require.js" "$rj/package.json" "$dest/requirejs/"
cat > "$dest/requirejs/LICENSE" <<'LIC'
MIT License (RequireJS)

Copyright jQuery Foundation and other contributors, https://jquery.org/

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in
all copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN
THE SOFTWARE.
LIC

mj="x/mathjax-$MATHJAX/package"
cp "$mj/LICENSE" "$mj/package.json" "$dest/mathjax/"
mkdir -p "$dest/mathjax/es5/output/chtml/fonts" "$dest/mathjax/es5/input/tex"
cp "$mj/es5/tex-chtml.js" "$dest/mathjax/es5/"
cp -r "$mj/es5/output/chtml/fonts/woff-v2" "$dest/mathjax/es5/output/chtml/fonts/"
cp -r "$mj/es5/input/tex/extensions" "$dest/mathjax/es5/input/tex/"
cp -r "$mj/es5/a11y" "$mj/es5/ui" "$dest/mathjax/es5/"

cat > "$dest/README.md" <<README
# Vendored JavaScript

Copied from the npm registry by \`bash tools/vendor_js.sh\` (\`npm pack\`, then the files
below), so that the built site never loads anything from a CDN.

| package | version | files | licence |
| --- | --- | --- | --- |
| @jupyter-widgets/html-manager | $HTML_MANAGER | html-manager/embed-amd.js and the font files it references | BSD-3-Clause (html-manager/LICENSE, third-party notices in embed.js.LICENSE.txt) |
| requirejs | $REQUIREJS | requirejs/require.js | MIT (requirejs/LICENSE) |
| mathjax | $MATHJAX | mathjax/es5/tex-chtml.js, output/chtml/fonts/woff-v2, input/tex/extensions, a11y, ui | Apache-2.0 (mathjax/LICENSE) |

Used by \`_config.yml\`: \`mathjax_path\` and myst-nb's \`nb_ipywidgets_js\` (which also loads
\`book/_static/widgets-setup.js\`, not vendored: it points html-manager at its font files here and
forwards its MathJax 2 calls to MathJax 3). The book's own sliders (flashlib.book.widgets) need
none of this: they are plain HTML and JavaScript inside each page.
README
echo "vendored into $dest"
du -sh "$dest"
