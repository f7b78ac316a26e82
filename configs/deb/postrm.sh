#!/bin/sh
# edgegate post-removal: on purge, the data and the service user go too.
set -e
if [ "$1" = purge ]; then
	rm -rf /var/lib/edgegate
	if getent passwd edgegate >/dev/null; then
		deluser --system edgegate >/dev/null 2>&1 || true
	fi
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
