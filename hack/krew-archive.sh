#!/usr/bin/env bash
# The krew archive of kubectl msj: dist/kubectl-msj-v<version>.tar.gz holding the launcher
# (plugins/krew/kubectl-msj), the multislice-operator wheel and LICENSE (krew's pre-submit checklist:
# the archive carries the license and the manifest extracts it); then plugins/msj.yaml gets the
# archive's uri and sha256. Byte-for-byte repeatable for one commit and one build backend:
# timestamps from the last commit (SOURCE_DATE_EPOCH), sorted entries, numeric root owner,
# gzip without a name or time.
#   hack/krew-archive.sh [--out DIR] [--manifest FILE] [--base-url URL] [--wheel WHL]
# --wheel: package this wheel instead of building one (the tests reuse theirs).
set -euo pipefail
shopt -s inherit_errexit
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/dist manifest=$root/plugins/msj.yaml
base_url=https://github.com/multislice-operator/multislice-operator/releases/download
wheel=""
while (($#)); do
  case $1 in
    --out) out=$2; shift ;;
    --manifest) manifest=$2; shift ;;
    --base-url) base_url=$2; shift ;;
    --wheel) wheel=$2; shift ;;
    *) echo "krew-archive: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
python=${PYTHON:-$root/.venv/bin/python}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -1)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 315532800)}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
if [[ -n $wheel ]]; then
  cp "$wheel" "$stage/"
else
  "$python" -m pip wheel --quiet --no-deps --wheel-dir "$stage" "$root" >&2
fi
cp "$root/plugins/krew/kubectl-msj" "$root/LICENSE" "$stage/"
chmod 0755 "$stage/kubectl-msj"
mkdir -p "$out"
archive=$out/kubectl-msj-v$version.tar.gz
(cd "$stage" && tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 \
  --numeric-owner --mode='u+rw,go+r,go-w' -cf - LICENSE kubectl-msj multislice_operator-*.whl) \
  | gzip -n -9 >"$archive"
sha=$(sha256sum "$archive" | cut -d' ' -f1)
"$python" - "$manifest" "$base_url/v$version/$(basename "$archive")" "$sha" "v$version" <<'PY'
import re, sys
path, uri, sha, version = sys.argv[1:]
text = open(path).read()
text = re.sub(r"(?m)^(\s+uri: ).*$", lambda m: m.group(1) + uri, text)
text = re.sub(r"(?m)^(\s+sha256: ).*$", lambda m: m.group(1) + f"\"{sha}\"", text)
text = re.sub(r"(?m)^(  version: ).*$", lambda m: m.group(1) + version, text)
open(path, "w").write(text)
PY
echo "$archive $sha"
