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

# start_time PID: when the process PID started, as `ps` tells it (empty if there is none). With
# its PID it names one process: a later process that reuses the PID has another start time.
start_time() {
  local words
  words="$(ps -o lstart= -p "$1" 2>/dev/null)" || return 0
  # shellcheck disable=SC2086  # split on purpose: one space between the words
  set -- $words
  echo "$*"
}

# record_pid FILE ROLE PID: add "ROLE PID START-TIME" to FILE, the processes a run started
# (read by stop_recorded).
record_pid() {
  echo "$2 $3 $(start_time "$3")" >> "$1"
}

# recorded_pid FILE ROLE: the PID recorded in FILE for ROLE if that process still runs (the
# same PID and start time), else nothing.
recorded_pid() {
  local role pid start
  [[ -f "$1" ]] || return 0
  while read -r role pid start; do
    if [[ "$role" == "$2" && "$pid" =~ ^[0-9]+$ && -n "$start" \
      && "$(start_time "$pid")" == "$start" ]]; then
      echo "$pid"
    fi
  done < "$1"
}

# home_pids HOME: this user's processes whose environment holds FLWR_HOME=HOME, the Flower
# home of one run.sh run (Linux's /proc; elsewhere nothing). Every process that run started
# inherits it (the SuperLink, its SuperExec, the simulation, Ray and its workers), also one left
# behind by a parent that was killed; this shell and its ancestors are left out.
home_pids() {
  local p mine=" " q="$BASHPID"
  [[ -r /proc/self/environ ]] || return 0
  while [[ "$q" =~ ^[0-9]+$ && "$q" -gt 1 ]]; do  # this shell and its ancestors: never these
    mine+="$q "
    q="$(ps -o ppid= -p "$q" | tr -d ' ')"
  done
  for p in /proc/[0-9]*; do
    [[ -O "$p" && "$mine" != *" ${p#/proc/} "* ]] || continue
    if grep -qzxF "FLWR_HOME=$1" "$p/environ" 2>/dev/null; then echo "${p#/proc/}"; fi
  done
}

# stop_pids PID...: TERM each process (only it, not its group); KILL what is left after 10 s.
stop_pids() {
  [[ $# -eq 0 ]] && return 0
  local p alive
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 1 40); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ "$alive" -eq 0 ]] && return 0
    sleep 0.25
  done
  kill -KILL "$@" 2>/dev/null || true
}

# stop_recorded HOME: stop what the run.sh run with Flower home HOME started, and nothing else:
# its run.sh (TERM: its own clean-up stops the SuperLink and removes or keeps HOME as after
# Ctrl-C), then the SuperLink recorded in HOME/pids with everything below it, then any process
# left with FLWR_HOME=HOME in its environment, each by its PID. A recorded PID counts only with
# its recorded start time. Prints what it stopped; removes HOME/pids and, if HOME stays (a run
# that did not finish keeps its logs), the app's files in it, as run.sh's clean-up does.
stop_recorded() {
  local home="$1" script link pid left=() stopped=()
  script="$(recorded_pid "$home/pids" run.sh)"
  link="$(recorded_pid "$home/pids" superlink)"
  if [[ -n "$script" ]]; then
    kill -TERM "$script" 2>/dev/null || true
    for _ in $(seq 1 80); do  # its clean-up takes up to 10 s (stop_tree)
      [[ "$(start_time "$script")" ]] || break
      sleep 0.25
    done
    stopped+=("run.sh $script")
  fi
  if [[ -n "$link" && "$(recorded_pid "$home/pids" superlink)" == "$link" ]]; then
    stop_tree "$link"
    stopped+=("SuperLink $link")
  fi
  while read -r pid; do left+=("$pid"); done < <(home_pids "$home")  # bash 3.2: no mapfile
  if [[ ${#left[@]} -gt 0 ]]; then
    stop_pids "${left[@]}"
    stopped+=("${#left[@]} more (${left[*]})")
  fi
  if [[ ${#stopped[@]} -gt 0 ]]; then
    echo "fedgo-flwr: stopped the run of $home: $(IFS=,; echo "${stopped[*]}" | sed 's/,/, /g')"
  fi
  if [[ -d "$home" ]]; then
    rm -f "$home/pids"
    rm -rf "$home/app" "$home/apps"
  fi
  [[ ${#stopped[@]} -gt 0 ]]
}
