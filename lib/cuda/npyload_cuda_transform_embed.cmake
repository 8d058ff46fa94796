# cmake -DIN=file -DOUT=header -P: writes IN as a C byte array
# npyl_tk_fatbin[] (16-byte aligned, as the driver expects a fatbin).
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* Generated from ${IN}: do not edit. */\n"
  "static const unsigned char npyl_tk_fatbin[${bytes}] __attribute__((aligned(16))) = {\n"
  "${body}\n};\n")
