#!/bin/sh
# edgegate pre-removal: stop the service (its data stays in /var/lib/edgegate).
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
	systemctl stop edgegate.service >/dev/null 2>&1 || true
	systemctl disable edgegate.service >/dev/null 2>&1 || true
fi
