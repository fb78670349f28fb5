#!/usr/bin/env bash
# bazel test //tests:deploy_test (tags: deploy; run alone with --test_tag_filters=deploy).
# The test itself is deploy_test.py (Debian's python3 and python3-yaml).
exec /usr/bin/python3 "$(dirname "$0")/deploy_test.py" "$@"
