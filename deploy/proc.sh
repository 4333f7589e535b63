# Process helpers shared by run.sh and deploy/local-federation.sh; source this file.
# Flower (1.41-1.42) starts each SuperLink's and SuperNode's SuperExec in a session of its own, with
# the ServerApp/ClientApp (and a simulation's Ray) under it, so stopping a Flower process by its
# own process group leaves those running: stop every process group below it instead.

# free_port PYTHON: print a TCP port on 127.0.0.1 that is free now.
free_port() {
  "$1" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# tree_groups PID...: the process groups of the PIDs and of all their descendants.
tree_groups() {
  ps -eo pid=,ppid=,pgid= | awk -v roots="$*" '
    { parent[$1] = $2; group[$1] = $3 }
    END {
      n = split(roots, r, " ")
      for (i = 1; i <= n; i++) keep[r[i]] = 1
      do {
        grew = 0
        for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 }
      } while (grew)
      for (p in keep) if (p in group) print group[p]
    }' | sort -u
}

# stop_tree PID...: TERM every process group at or below the PIDs; KILL what is left after 10 s.
# The caller's own process group is left alone (a child it started with `&` shares it).
stop_tree() {
  [[ $# -eq 0 ]] && return 0
  local groups g alive own
  own="$(ps -o pgid= -p $$ | tr -d ' ')"
  groups="$(tree_groups "$@" | grep -vx "$own" || true)"
  [[ -z "$groups" ]] && return 0
  for g in $groups; do kill -TERM -- "-$g" 2>/dev/null || true; done
  for _ in $(seq 1 40); do
    alive=0
    for g in $groups; do kill -0 -- "-$g" 2>/dev/null && alive=1; done
    [[ "$alive" -eq 0 ]] && return 0
    sleep 0.25
  done
  for g in $groups; do kill -KILL -- "-$g" 2>/dev/null || true; done
}
