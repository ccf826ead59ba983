"""What ends a docker command's processes with it: a small POSIX-sh wrapper run by every exec.

Docker has no exec kill and no per-exec process group that outlives the exec's leader, and a
``setsid`` or double-forked child escapes any process-group kill. So the wrapper runs the command
(under ``timeout -k``), then sweeps the container: it SIGKILLs every process except PID 1 (the
init), the container's keep-alive process (its lowest other pid), itself, other commands that are
still running (wrappers, found by the first line of their script, and their descendants) and processes started
with ``keep_background`` (``ROLLOUT_KEEP=1`` in their environment). It repeats while it finds
something, so a fork bomb is worn down too. It uses shell builtins only (read, kill, case, test),
so it works while the container's pids limit is exhausted.

Detached processes of a command that is still running die when another command of the same
sandbox ends; a command that must leave a server running passes ``keep_background``.
"""

from __future__ import annotations

KEEP_ENV = "ROLLOUT_KEEP"
MARK = "# rollout-exec:"  # the first line of every wrapper, file command and the keep-alive: spared
MAX_ROUNDS = 50

SWEEP = r"""# rollout-exec: the first line is how other wrappers recognise this one in /proc/PID/cmdline
"$@"; rc=$?
[ -n "$ROLLOUT_KEEP" ] && exit $rc
me=$$
sweep() {
  low=""
  for d in /proc/[0-9]*; do p=${d#/proc/}
    [ "$p" = 1 ] && continue
    if [ -z "$low" ] || [ "$p" -lt "$low" ]; then low=$p; fi
  done
  victims=""
  for d in /proc/[0-9]*; do p=${d#/proc/}
    case " 1 $low $me " in *" $p "*) continue;; esac
    q=$p; spare=""
    while [ -n "$q" ] && [ "$q" != 0 ] && [ "$q" != 1 ]; do
      c=""; e=""; s=""
      { read -r c < /proc/$q/cmdline; } 2>/dev/null
      case $c in *"# rollout-exec:"*) [ "$q" != "$me" ] && spare=1; break;; esac
      { read -r e < /proc/$q/environ; } 2>/dev/null
      case $e in *ROLLOUT_KEEP=1*) spare=1; break;; esac
      { read -r s < /proc/$q/stat; } 2>/dev/null
      s=${s##*) }; set -- $s; q=$2
    done
    [ -z "$spare" ] && victims="$victims $p"
  done
  [ -n "$victims" ] && kill -9 $victims 2>/dev/null
  [ -n "$victims" ]
}
n=0
while sweep && [ $n -lt MAX_ROUNDS ]; do n=$((n+1)); done
exit $rc
""".replace("MAX_ROUNDS", str(MAX_ROUNDS))


def wrap(argv: list[str], env: dict[str, str], keep_background: bool) -> list[str]:
    """``argv`` as the wrapper runs it (``env`` gets the keep marker when asked)."""
    if keep_background:
        env[KEEP_ENV] = "1"
    return ["sh", "-c", SWEEP, "rollout-exec", *argv]
