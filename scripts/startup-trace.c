// scripts/startup-trace.c (built and run by scripts/startup-order.sh): runs a program under
// ptrace, single-stepping every thread, and writes to $TRACE_OUT each distinct instruction address
// it ran in the executable's code, as "STEP OFFSET" (the step it first ran at, its offset from the
// executable's load base, in hex). Linux x86_64 only.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <sys/user.h>
#include <stdint.h>

static unsigned long base = 0, lo = 0, hi = 0;
static uint32_t *seen;

static void find_maps(pid_t pid, const char *exe) {
  char path[64]; snprintf(path, sizeof path, "/proc/%d/maps", pid);
  FILE *f = fopen(path, "r"); char line[1024];
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b, off; char perms[8], file[900] = {0};
    if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %899s", &a, &b, perms, &off, file) < 4) continue;
    if (!strstr(file, exe)) continue;
    if (off == 0 && !base) base = a;
    if (perms[2] == 'x') { lo = a; hi = b; }
  }
  fclose(f);
}

int main(int argc, char **argv) {
  pid_t child = fork();
  if (child == 0) { ptrace(PTRACE_TRACEME, 0, 0, 0); raise(SIGSTOP); execvp(argv[1], argv + 1); _exit(127); }
  int st; waitpid(child, &st, __WALL);
  ptrace(PTRACE_SETOPTIONS, child, 0, PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL);
  ptrace(PTRACE_CONT, child, 0, 0);
  int stepping = 0, live = 1; long steps = 0;
  const char *name = strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1];
  while (live > 0) {
    pid_t pid = waitpid(-1, &st, __WALL);
    if (pid < 0) break;
    if (WIFEXITED(st) || WIFSIGNALED(st)) { live--; continue; }
    if (!WIFSTOPPED(st)) continue;
    int sig = WSTOPSIG(st), event = st >> 16, deliver = 0;
    if (event == PTRACE_EVENT_EXEC) {
      find_maps(pid, name); seen = calloc(hi - lo, 4); stepping = 1;
      fprintf(stderr, "text %lx-%lx base %lx\n", lo, hi, base);
    } else if (event == PTRACE_EVENT_CLONE) {
      live++;
    } else if (sig == SIGTRAP) {
      if (stepping) {
        struct user_regs_struct regs; ptrace(PTRACE_GETREGS, pid, 0, &regs);
        steps++;
        if (regs.rip >= lo && regs.rip < hi && !seen[regs.rip - lo]) seen[regs.rip - lo] = (uint32_t)steps;
      }
    } else if (sig == SIGSTOP) {
      // a new thread's first stop, or our own
    } else {
      deliver = sig;
    }
    if (stepping) ptrace(PTRACE_SINGLESTEP, pid, 0, deliver); else ptrace(PTRACE_CONT, pid, 0, deliver);
  }
  fprintf(stderr, "%ld steps\n", steps);
  FILE *out = fopen(getenv("TRACE_OUT"), "w");
  for (unsigned long i = 0; seen && i < hi - lo; i++) if (seen[i]) fprintf(out, "%u %lx\n", seen[i], lo + i - base);
  fclose(out);
  return 0;
}
