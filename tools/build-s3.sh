#!/usr/bin/env bash
# Fetch s3proxy (a real S3-compatible server, Apache-2.0, Java 17) from Maven Central, once per
# version, into the shared cache; the fetch tests (tests/pod/test_fetch_s3.py) run it with its
# filesystem backend. Prints the path of the jar.
# Usage: tools/build-s3.sh [--dir]   (--dir: print the path; exit 1 if it is not fetched yet)
set -euo pipefail
version=2.6.0
sha1=cada399d8a8155d40f82f6a3d22f0288c96046d0  # Maven Central's .sha1 of the jar-with-dependencies
dir="${SLUICEWAY_CACHE:-$HOME/.cache/sluiceway}/s3proxy-$version"
jar="$dir/s3proxy.jar"
if [ -f "$jar" ]; then echo "$jar"; exit 0; fi
if [ "${1:-}" = "--dir" ]; then echo "$jar"; exit 1; fi
for tool in java mvn; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-s3.sh: $tool is needed to fetch s3proxy: apt-get install openjdk-17-jre-headless maven" >&2
    exit 1
  fi
done
echo "build-s3.sh: fetching org.gaul:s3proxy:$version (about 40 MiB) from Maven Central" >&2
mvn -q -B dependency:get -Dartifact="org.gaul:s3proxy:$version:jar:jar-with-dependencies" -Dtransitive=false >&2
src="${MAVEN_REPO:-$HOME/.m2/repository}/org/gaul/s3proxy/$version/s3proxy-$version-jar-with-dependencies.jar"
got=$(sha1sum "$src" | cut -d' ' -f1)
if [ "$got" != "$sha1" ]; then
  echo "build-s3.sh: $src has sha1 $got, expected $sha1" >&2
  exit 1
fi
mkdir -p "$dir.tmp"
cp "$src" "$dir.tmp/s3proxy.jar"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "$jar"
