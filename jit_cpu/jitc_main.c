/* jitc_main.c — kiln-jitc, the compiler process (jit_cpu/jitc.h): spawned
 * by the library, never run by hand. */
int jitc_main(int argc, char **argv);

int main(int argc, char **argv) { return jitc_main(argc, argv); }
