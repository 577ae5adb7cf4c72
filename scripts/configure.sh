#!/bin/sh
# Prints the make variables for the detected libraries (pkg-config), for build/<cfg>/config.mk.
set -eu
pc() { pkg-config "$@"; }
echo "DEP_CFLAGS := $(pc --cflags jansson hiredis)"
echo "DEP_LIBS := $(pc --libs jansson hiredis) -lpthread"
if [ "${KVT_NO_URING:-0}" != 1 ] && pc --exists liburing; then
    echo "URING_CFLAGS := -DKVT_HAVE_URING=1 $(pc --cflags liburing)"
    echo "URING_LIBS := $(pc --libs liburing)"
fi
echo "CMOCKA_CFLAGS := $(pc --cflags cmocka)"
echo "CMOCKA_LIBS := $(pc --libs cmocka)"
