/* train_opt.h — how the trainer's modules take their own command-line options.
 *
 * A module with options (train_sched, train_ckpt, train_pack, train_adapter, train_eval)
 * exports a getopt_long table of them, each with getopt's val TRAIN_OPT, and a parser that
 * finds the option by its spelling (cli.flag, "--resume"): the tool appends the tables to its
 * own and hands every TRAIN_OPT to the parsers in turn, so an option is declared once, where it
 * is read, and no tool has to mirror a module's order of options. */
#ifndef TRAIN_OPT_H
#define TRAIN_OPT_H

#include <getopt.h>

#define TRAIN_OPT 0x7f00       /* getopt_long's val of every module option */
#define TRAIN_OPT_NOT_MINE 1   /* a parser's answer for another module's option */

#endif
