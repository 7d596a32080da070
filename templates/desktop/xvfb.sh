#!/bin/sh
# /usr/local/bin/Xvfb, ahead of Debian's /usr/bin/Xvfb on PATH: an X server started by hand
# on the display the template's own desktop holds (`lizard-desktop`, up since the snapshot
# on :0) takes its place, so it gets exactly the size, depth and options it asks for.
# E2B's desktop SDK starts its desktop this way (`Xvfb :0 -ac -screen 0 WxHx24 ...` as
# `user`, then `startxfce4`). Any other display, or a desktop not the template's, is left
# alone: Debian's Xvfb runs as asked (and, for a display in use, says so and exits).
set -eu
own_display=":0"
if [ "${1:-}" = "$own_display" ] && [ -e /run/lizard-desktop.up ]; then
  if [ "$(id -u)" = 0 ]; then
    lizard-desktop stop
  else
    # `user` has sudo without a password, as in E2B's templates.
    sudo -n /usr/local/bin/lizard-desktop stop || echo "Xvfb: cannot stop the template's desktop on $own_display" >&2
  fi
fi
exec /usr/bin/Xvfb "$@"
