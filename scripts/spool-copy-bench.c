/* The output spool's copy, alone: 256 MiB from a pipe read by one process
 * (a) into a heap buffer and dropped, (b) into a heap buffer then written in
 * ~1 MiB pwrite calls over a 64 MiB ring file (the spool's pattern), (c) read
 * straight into a shared mapping of a preallocated 64 MiB ring file (the
 * copy the spool would save). Prints the reader's CPU (BENCHMARKS.md).
 *
 *   gcc -O2 -o /tmp/spool-copy-bench scripts/spool-copy-bench.c
 *   for m in 0 1 2; do /tmp/spool-copy-bench $m /var/tmp/spool-copy-bench.ring; done
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#define RING (64UL<<20)
#define TOTAL (256UL<<20)
#define CH (64UL<<10)
static double cpu(void){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec+r.ru_stime.tv_sec+(r.ru_utime.tv_usec+r.ru_stime.tv_usec)/1e6;}
int main(int argc,char**argv){
  int mode=atoi(argv[1]); const char*path=argv[2];
  int p[2]; pipe(p); fcntl(p[0],F_SETPIPE_SZ,1<<20);
  pid_t c=fork(); if(!c){close(p[0]); char*b=malloc(CH); memset(b,'x',CH); size_t left=TOTAL; while(left){ssize_t n=write(p[1],b,left<CH?left:CH); if(n<=0)_exit(1); left-=n;} _exit(0);} close(p[1]);
  int fd=-1; char*map=0; char*buf=malloc(1<<20); size_t off=0,total=0,pend=0;
  if(mode){fd=open(path,O_RDWR|O_CREAT|O_TRUNC,0600); if(mode==2){fallocate(fd,0,0,RING); map=mmap(0,RING,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);}}
  double t0=cpu();
  for(;;){
    ssize_t n;
    if(mode==2){ size_t room=RING-off; n=read(p[0],map+off,room<CH?room:CH); if(n<=0)break; volatile char s=map[off]; (void)s; off=(off+n)%RING; }
    else { n=read(p[0],buf+pend,CH); if(n<=0)break; pend+=n; if(pend>=(1<<20)-CH){ if(mode==1){ pwrite(fd,buf,pend,off); off=(off+pend)%RING;} pend=0; } }
    total+=n;
  }
  if(mode==1&&pend) pwrite(fd,buf,pend,off);
  double t1=cpu(); waitpid(c,0,0);
  printf("mode %d: %zu MiB, reader CPU %.1f ms\n",mode,total>>20,(t1-t0)*1000);
  if(fd>=0){close(fd); unlink(path);}
  return 0;}
