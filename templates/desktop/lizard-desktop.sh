#!/bin/sh
# The `desktop` template's desktop: Xvfb on :0 with openbox, and on demand the live view
# (x11vnc on a Unix socket, behind stream.py on port 6080).
#
#   lizard-desktop start [WxH]     (re)start the desktop (default $LIZARD_DESKTOP_RESOLUTION or 1024x768)
#   lizard-desktop resize WxH      restart it at another size (windows are closed)
#   lizard-desktop stop            stop it (and the live view)
#   lizard-desktop open TARGET     a URL or file in Chromium (detached)
#   lizard-desktop launch CMD      a shell command line, detached, on the desktop
#   lizard-desktop stream-start    the live view; its secret on stdin (one line)
#   lizard-desktop stream-stop
#
# Every daemon runs in a session of its own (setsid), so it outlives the exec that
# started it; its pid and log are under /run/lizard-desktop.
set -eu
RUN=/run/lizard-desktop
export DISPLAY="${DISPLAY:-:0}"
STREAM_PORT=6080
# Readable by anyone (RUN is not): that the desktop is up, for /usr/local/bin/Xvfb.
UP=/run/lizard-desktop.up
mkdir -p "$RUN"
chmod 0700 "$RUN"

die() { echo "lizard-desktop: $*" >&2; exit 2; }

daemon() {
  name=$1
  shift
  setsid "$@" >"$RUN/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

stop() {
  pidfile="$RUN/$1.pid"
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  i=0
  while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

# until the daemon NAME answers COMMAND…, at most $2 tenths of a second; fails at once
# when the daemon has exited, so that its log, not a timeout, says why
until_up() {
  name=$1
  n=$2
  shift 2
  pid=$(cat "$RUN/$name.pid")
  i=0
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || return 1
    i=$((i + 1))
    [ $i -le "$n" ] || return 1
    sleep 0.1
  done
}

check_size() {
  case "$1" in
    [1-9][0-9]*x[1-9][0-9]*) ;;
    *) die "resolution must be WIDTHxHEIGHT, got '$1'" ;;
  esac
  w=${1%x*}
  h=${1#*x}
  case "$w$h" in *[!0-9]*) die "resolution must be WIDTHxHEIGHT, got '$1'" ;; esac
  [ "$w" -ge 320 ] && [ "$w" -le 7680 ] && [ "$h" -ge 240 ] && [ "$h" -le 4320 ] \
    || die "resolution $1 is outside 320x240..7680x4320"
}

# the desktop at size $1, in place of one already up (a second Xvfb beside it cannot
# take display :0); a bad size is refused before anything is stopped
start_desktop() {
  size=$1
  check_size "$size"
  stop_desktop
  rm -f "$RUN/ready" "$UP" /tmp/.X0-lock /tmp/.X11-unix/X0
  # -noreset: by default Xvfb resets whenever its last client leaves (every probe below,
  # every xdotool action), recompiling its keymap each time; on one slow vCPU a client
  # that came during a reset was refused ("Failed to open the display").
  # Debian's own: /usr/local/bin/Xvfb is the one that makes this desktop give way.
  daemon xvfb /usr/bin/Xvfb "$DISPLAY" -screen 0 "${size}x24" -dpi 96 -nolisten tcp -noreset -ac
  until_up xvfb 300 xdotool getdisplaygeometry || die "Xvfb did not start: $(tail -5 "$RUN/xvfb.log")"
  daemon wm openbox
  until_up wm 300 sh -c 'xprop -root _NET_SUPPORTING_WM_CHECK | grep -q "window id"' \
    || die "openbox did not start: $(tail -5 "$RUN/wm.log")"
  # After openbox, which paints the root window black when it starts.
  xsetroot -solid '#3b4252' || true
  echo "$size" >"$RUN/size"
  touch "$RUN/ready" "$UP"
}

stop_desktop() {
  stop_stream
  pkill -x chromium 2>/dev/null || true
  stop wm
  stop xvfb
  rm -f "$RUN/ready" "$UP"
}

start_stream() {
  IFS= read -r secret || die "stream-start reads its secret from stdin"
  case "$secret" in
    *[!A-Za-z0-9_-]* | "") die "the stream secret must be [A-Za-z0-9_-]" ;;
  esac
  [ ${#secret} -ge 16 ] || die "the stream secret must have at least 16 characters"
  [ -f "$RUN/ready" ] || die "the desktop is not running"
  stop_stream
  rm -f "$RUN/vnc.sock"
  # The Unix socket only: -rfbport 0 ends IPv4 listening, -rfbportv6 -1 the IPv6 listener
  # (*:5900, without a password) that this build opens even with -rfbport 0 -no6.
  daemon vnc x11vnc -display "$DISPLAY" -rfbport 0 -rfbportv6 -1 -no6 -unixsock "$RUN/vnc.sock" -forever -shared -nopw \
    -noxdamage -quiet
  until_up vnc 200 test -S "$RUN/vnc.sock" || die "x11vnc did not start: $(tail -5 "$RUN/vnc.log")"
  umask 077
  printf '%s\n' "$secret" >"$RUN/stream.secret"
  rm -f "$RUN/stream.ready"
  daemon stream python3 /usr/local/lib/lizard-desktop/stream.py --port "$STREAM_PORT" \
    --secret-file "$RUN/stream.secret" --vnc "$RUN/vnc.sock" --web /usr/share/novnc --ready "$RUN/stream.ready"
  until_up stream 200 test -e "$RUN/stream.ready" || die "the live view did not start: $(tail -5 "$RUN/stream.log")"
  echo "$STREAM_PORT"
}

stop_stream() {
  stop stream
  stop vnc
  rm -f "$RUN/stream.secret" "$RUN/stream.ready" "$RUN/vnc.sock"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  start)
    [ $# -le 1 ] || die "usage: lizard-desktop start [WxH]"
    start_desktop "${1:-${LIZARD_DESKTOP_RESOLUTION:-1024x768}}"
    ;;
  stop) stop_desktop ;;
  resize)
    [ $# -eq 1 ] || die "usage: lizard-desktop resize WxH"
    start_desktop "$1"
    ;;
  open)
    [ $# -eq 1 ] || die "usage: lizard-desktop open URL_OR_FILE"
    setsid -f chromium --no-sandbox --test-type --no-first-run --no-default-browser-check \
      --disable-gpu --disable-dev-shm-usage --password-store=basic --disable-features=Translate \
      --user-data-dir=/root/.config/chromium --start-maximized -- "$1" >>"$RUN/chromium.log" 2>&1 </dev/null
    ;;
  launch)
    [ $# -eq 1 ] || die "usage: lizard-desktop launch 'COMMAND LINE'"
    setsid -f sh -c "$1" >>"$RUN/launch.log" 2>&1 </dev/null
    ;;
  stream-start) start_stream ;;
  stream-stop) stop_stream ;;
  *) die "usage: lizard-desktop start|stop|resize|open|launch|stream-start|stream-stop" ;;
esac
