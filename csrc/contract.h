/* The numbers fixed by docs/internals.md, shared by the parser, the key
 * builder and the reply decoder, and exported to Python by module.c. */
#ifndef MODERATO_CONTRACT_H
#define MODERATO_CONTRACT_H

/* Policies in one rate string, keys in one decision. */
#define ACCEL_MAX_POLICIES 16

/* Longest window of the direct backend contract, in seconds: one day. */
#define ACCEL_MAX_WINDOW_S 86400

/* Longest window a rate string may name: ten 360-day years. Windows above a
 * day are the long-window path: each algorithm admits the (limit, window)
 * pairs its arithmetic keeps exact (docs/internals.md, "Long windows"). */
#define ACCEL_MAX_LONG_WINDOW_S 311040000LL

/* Largest limit of a policy: its capacity_scaled (limit * 1000) stays
 * below 2^53, so Lua's doubles hold it exactly. */
#define ACCEL_MAX_LIMIT 9007199254LL

/* Capacities and costs travel scaled by this factor. */
#define ACCEL_SCALE 1000LL

/* Largest integer that crosses a boundary: 2^53. */
#define ACCEL_MAX_SCALED 9007199254740992LL

#endif /* MODERATO_CONTRACT_H */
