# cmake -DIN=file -DOUT=header -DNAME=symbol [-DTEXT=1] -P: writes IN as a C
# byte array NAME[] (16-byte aligned, as the driver expects a fatbin); with
# TEXT, NUL-terminated (a source text for NVRTC).
file(READ ${IN} hex HEX)
if(TEXT)
  string(APPEND hex "00")
endif()
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* Generated from ${IN}: do not edit. */\n"
  "static const unsigned char ${NAME}[${bytes}] __attribute__((aligned(16))) = {\n"
  "${body}\n};\n")
