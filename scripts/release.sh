#!/usr/bin/env bash
# Prepares a release of every ratekit module at one version.
#
#   scripts/release.sh v0.2.0          # rewrite the go.mod files, tidy, print the tags
#   scripts/release.sh v0.2.0 --tag    # the same, then create the tags on HEAD
#
# Every go.mod that requires a ratekit module is set to require it at the
# new version, each module keeps a replace line only for the ratekit modules
# it requires (so the repository builds from its own tree; replace lines do
# not apply to users), and `go mod tidy` runs in every module. The tags are
# the root module's version and <dir>/<version> for each nested library
# module; the examples, the benchmarks and internal/itest are never tagged.
# Commit the go.mod changes first, then run with --tag and push the tags.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:-}
if ! [[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "usage: scripts/release.sh vMAJOR.MINOR.PATCH [--tag]" >&2
	exit 2
fi
tag=false
[ "${2:-}" = "--tag" ] && tag=true

modules=$(bash .ci/modules)

# is_library DIR: a module users install (everything but the examples, the
# benchmarks and the test-only modules under internal/).
is_library() {
	case $1 in examples | examples/* | benchmarks | benchmarks/* | internal/*) return 1 ;; esac
	return 0
}

for m in $modules; do
	f=$m/go.mod
	json=$(go mod edit -json "$f")
	required=$(jq -r '(.Require // [])[] | select(.Path | startswith("github.com/ratekit/ratekit")) | .Path' <<<"$json")
	replaced=$(jq -r '(.Replace // [])[] | select(.Old.Path | startswith("github.com/ratekit/ratekit")) | .Old.Path' <<<"$json")
	for p in $required; do
		if is_library "$m" && [[ $p == */internal/* ]]; then
			echo "$f requires $p, a test-only module: a library module must not" >&2
			exit 1
		fi
		go mod edit -require="$p@$version" "$f"
	done
	for p in $replaced; do
		grep -qxF "$p" <<<"$required" || go mod edit -dropreplace="$p" "$f"
	done
done

for m in $modules; do
	(cd "$m" && go mod tidy)
done

tags=()
for m in $modules; do
	is_library "$m" || continue
	if [ "$m" = . ]; then tags+=("$version"); else tags+=("$m/$version"); fi
done
for t in "${tags[@]}"; do
	if $tag; then
		git tag "$t"
		echo "tagged $t"
	else
		echo "$t"
	fi
done
