/* A probe run inside a container of the real-node tier through the
 * runtime's exec (the agent image has no shell): `probe read FILE` prints
 * FILE; `probe write FILE` tries every way to change FILE and its directory
 * (open for writing, truncate, unlink, rename over, create beside it,
 * chmod) and prints each refusal; exit 0 when every one was refused, 1 when
 * one succeeded, 2 on a usage error or a failed read. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int changed;

static void report(const char *what, int rc) {
    if (rc < 0) {
        printf("refused %s: %s\n", what, strerror(errno));
    } else {
        printf("ALLOWED %s\n", what);
        changed = 1;
    }
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    const char *file = argv[2];
    if (strcmp(argv[1], "read") == 0) {
        char buf[4096];
        int fd = open(file, O_RDONLY);
        if (fd < 0) { printf("read %s: %s\n", file, strerror(errno)); return 2; }
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)n, stdout);
        close(fd);
        return 0;
    }
    if (strcmp(argv[1], "write") != 0) return 2;
    char dir[4096], beside[4200];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    snprintf(beside, sizeof beside, "%s/.mountguard-probe", dir);
    int fd = open(file, O_WRONLY);
    report("open for writing", fd);
    if (fd >= 0) close(fd);
    report("truncate", truncate(file, 0));
    report("chmod", chmod(file, 0777));
    fd = open(beside, O_WRONLY | O_CREAT | O_EXCL, 0600);
    report("create beside", fd);
    if (fd >= 0) { close(fd); unlink(beside); }
    report("rename over", rename(file, beside));
    report("unlink", unlink(file));
    return changed;
}
