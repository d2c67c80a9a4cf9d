#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
void ggml_gemm_q4_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * s, size_t bs, const void * vx, const void * vy, int nrows, int nc);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int n=1536, nc=atoi(argv[1]);
  size_t wsz=(size_t)(nc/8)*(n/256)*1152; size_t asz=(size_t)16*(n/256)*292+4096;
  uint8_t*w=malloc(wsz),*a=malloc(asz);
  for(size_t i=0;i<wsz;i++)w[i]=rand();
  for(size_t i=0;i<asz;i++)a[i]=rand()&0x3f;
  for(size_t g=0;g<wsz/1152;g++){uint16_t*d=(uint16_t*)(w+g*1152);for(int k=0;k<16;k++)d[k]=0x3c00;}
  float*s=malloc(sizeof(float)*nc*16);
  int it=100;
  int R[]={4,6,8,16};
  for(int j=0;j<4;j++){int r=R[j]; double best=1e9,best2=1e9;
  for(int k=0;k<3;k++){double t0=now();for(int i=0;i<it;i++) ggml_gemm_q4_K_8x8_q8_K(n,s,nc,w,a,r - r%4,nc); double t=(now()-t0)/it; if(t<best)best=t;}
  for(int k=0;k<3;k++){double t0=now();for(int i=0;i<it;i++) ggml_gemv_q4_K_8x8_q8_K_rows(n,s,nc,w,a,r,nc); double t=(now()-t0)/it; if(t<best2)best2=t;}
  printf("nc=%d %d rows: gemm(%d) %.1f us  rows-kernel %.1f us\n",nc,r,r-r%4,best*1e6,best2*1e6);}
}
