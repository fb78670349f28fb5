#!/bin/sh
# onebit-launch in the image: the binaries are under /opt/onebit (flags given later win).
exec /opt/onebit/deploy/onebit-launch --bin_dir=/opt/onebit "$@"
