#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
void ggml_gemv_q4_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * s, size_t bs, const void * vx, const void * vy, int nrows, int nc);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int n=1536, nc=atoi(argv[1]);
  size_t wsz=(size_t)(nc/8)*(n/256)*1152; size_t asz=(size_t)3*(n/256)*292;
  uint8_t*w=malloc(wsz),*a=malloc(asz);
  for(size_t i=0;i<wsz;i++)w[i]=rand();
  for(size_t i=0;i<asz;i++)a[i]=rand();
  // keep fp16 scales finite: set every 2-byte d/dmin to 0x3c00 (1.0) at block starts
  for(size_t g=0;g<wsz/1152;g++){uint16_t*d=(uint16_t*)(w+g*1152);for(int k=0;k<16;k++)d[k]=0x3c00;}
  for(int r=0;r<3*(n/256);r++){float*d=(float*)(a+r*292);*d=1.0f;}
  float*s=malloc(sizeof(float)*nc*3);
  int it=200;
  for(int rows=1;rows<=3;rows++){
    double best=1e9;
    for(int k=0;k<5;k++){double t0=now();for(int i=0;i<it;i++){ for(int r=0;r<rows;r++) ggml_gemv_q4_K_8x8_q8_K(n,s+r*nc,nc,w,a+r*(n/256)*292,1,nc);} double t=(now()-t0)/it; if(t<best)best=t;}
    double best2=1e9;
    for(int k=0;k<5;k++){double t0=now();for(int i=0;i<it;i++){ ggml_gemv_q4_K_8x8_q8_K_rows(n,s,nc,w,a,rows,nc);} double t=(now()-t0)/it; if(t<best2)best2=t;}
    printf("nc=%d rows=%d  gemv x%d: %.1f us   rows kernel: %.1f us  ratio %.2f\n",nc,rows,rows,best*1e6,best2*1e6,best2/best);
  }
}
