/*
 * keelson's test pause process: the first process of every pod sandbox.
 * It holds the pod's namespaces, reaps the orphans that get reparented to
 * it (it is PID 1 of the pod's PID namespace), and exits 0 on SIGINT or
 * SIGTERM so that stopping a sandbox is quick.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_child(int sig)
{
	int saved = errno;

	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

static int handle(int sig, void (*fn)(int), int flags)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = fn;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("keelson-pause 3.10");
		return 0;
	}
	if (getpid() != 1)
		fputs("keelson-pause: warning: not running as PID 1\n", stderr);
	if (handle(SIGINT, on_stop, 0) || handle(SIGTERM, on_stop, 0) ||
	    handle(SIGCHLD, on_child, SA_NOCLDSTOP)) {
		perror("keelson-pause: sigaction");
		return 1;
	}
	for (;;)
		pause();
}
