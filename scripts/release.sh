#!/usr/bin/env bash
# Cuts a release of every ratekit module at one version.
#
#   scripts/release.sh v0.2.0          # commit the release, print the tags to create
#   scripts/release.sh v0.2.0 --tag    # the same, and create the tags
#
# It refuses a tree with uncommitted or untracked changes, and a version
# whose tags exist. Then:
#
#  1. every go.mod that requires a ratekit module requires it at the new
#     version, and `go mod tidy` runs in every module (the replace lines
#     still point at the tree, so tidying needs no published module);
#  2. the library modules' ratekit replace lines are dropped: a released
#     go.mod has none (`go install …@version` refuses a module with one, and
#     users' builds ignore them); the examples, the benchmarks and
#     internal/itest keep theirs, being never released;
#  3. that is committed ("release: <version>") and the tags name that commit
#     alone: the root module's <version>, and <dir>/<version> for each nested
#     library module;
#  4. a second commit puts the library modules' replace lines back, so that
#     the repository keeps building each module against its siblings in the
#     tree (a sibling at the new version is fetchable only once the tags are
#     pushed, and development needs the tree's code anyway).
#
# Push the branch and the printed tags afterwards. With a tree already in
# release form (nothing to change), step 3 commits nothing and the tags
# name HEAD.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:-}
if ! [[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "usage: scripts/release.sh vMAJOR.MINOR.PATCH [--tag]" >&2
	exit 2
fi
tag=false
case ${2:-} in
"") ;;
--tag) tag=true ;;
*)
	echo "usage: scripts/release.sh vMAJOR.MINOR.PATCH [--tag]" >&2
	exit 2
	;;
esac

if [ -n "$(git status --porcelain --untracked-files=normal)" ]; then
	echo "release.sh: the tree has uncommitted or untracked changes; commit or stash them first:" >&2
	git status --short >&2
	exit 1
fi

modules=$(bash .ci/modules)
root=github.com/ratekit/ratekit

# is_library DIR: a module users install (everything but the examples, the
# benchmarks and the test-only modules under internal/).
is_library() {
	case $1 in examples | examples/* | benchmarks | benchmarks/* | internal/*) return 1 ;; esac
	return 0
}

tags=()
for m in $modules; do
	is_library "$m" || continue
	if [ "$m" = . ]; then tags+=("$version"); else tags+=("$m/$version"); fi
done
for t in "${tags[@]}"; do
	if git rev-parse -q --verify "refs/tags/$t" >/dev/null; then
		echo "release.sh: tag $t exists" >&2
		exit 1
	fi
done

# ratekit_requires DIR: the ratekit modules DIR's go.mod requires.
ratekit_requires() {
	go mod edit -json "$1/go.mod" | jq -r --arg root "$root" '(.Require // [])[] | select(.Path == $root or (.Path | startswith($root + "/"))) | .Path'
}

# 1. Require the siblings at the new version; tidy with the tree's replaces.
for m in $modules; do
	for p in $(ratekit_requires "$m"); do
		if is_library "$m" && [[ $p == */internal/* ]]; then
			echo "release.sh: $m/go.mod requires $p, a test-only module: a library module must not" >&2
			exit 1
		fi
		go mod edit -require="$p@$version" "$m/go.mod"
	done
done
for m in $modules; do
	(cd "$m" && go mod tidy)
done

# 2. A released go.mod replaces no ratekit module.
for m in $modules; do
	is_library "$m" || continue
	for p in $(go mod edit -json "$m/go.mod" | jq -r --arg root "$root" '(.Replace // [])[] | select(.Old.Path == $root or (.Old.Path | startswith($root + "/"))) | .Old.Path'); do
		go mod edit -dropreplace="$p" "$m/go.mod"
	done
done

# 3. Commit the release and name it.
if [ -n "$(git status --porcelain)" ]; then
	git add -u
	git commit -q -m "release: $version" -m "Every module requires its ratekit siblings at $version; the library modules' go.mod files replace none."
fi
release=$(git rev-parse HEAD)

# 4. Put the development replace lines back: each library module builds
# against its siblings in the tree.
for m in $modules; do
	is_library "$m" || continue
	for p in $(ratekit_requires "$m"); do
		dir=${p#"$root"}
		dir=${dir#/}
		rel=$(realpath -m --relative-to="$m" "${dir:-.}")
		[[ $rel == ..* ]] || rel=./$rel
		go mod edit -replace="$p=$rel" "$m/go.mod"
	done
done
if [ -n "$(git status --porcelain)" ]; then
	git add -u
	git commit -q -m "modules: replace lines for development after $version" -m "The library modules build against their siblings in the tree again; the release commit $release has none."
fi

echo "release.sh: $version is commit $release"
for t in "${tags[@]}"; do
	if $tag; then
		git tag "$t" "$release"
		echo "tagged $t"
	else
		echo "git tag $t $release"
	fi
done
echo "then: git push origin HEAD ${tags[*]}"
